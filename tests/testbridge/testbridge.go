// Package testbridge runs a complete vgpu-bridge in-process for tests,
// configured against the real local services (Postgres, RabbitMQ,
// Placement) with the policy files shipped in etc/vgpu-bridge.
package testbridge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Tokens of the operator API in the configurations Config builds.
const (
	AdminToken  = "test-admin-token"
	ReaderToken = "test-reader-token"
)

// EtcDir is the repository's etc/vgpu-bridge directory.
func EtcDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "etc", "vgpu-bridge")
}

// Overrides returns the --set overrides of a full bridge configuration on
// the test services with dbURL as the database, signed with testkeys.For(t)
// (agents of the test enrol with testkeys.For(t).Agent); extra ones win.
func Overrides(t testing.TB, dbURL string, extra ...string) []string {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "api-tokens")
	placementToken := filepath.Join(dir, "placement-token")
	if err := os.WriteFile(tokens, []byte(AdminToken+" admin ops\n"+ReaderToken+" reader viewer\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(placementToken, []byte("admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	etc := EtcDir()
	return append([]string{
		"DEFAULT.transport_url=" + testsvc.TransportURL(t),
		"DEFAULT.log_format=text",
		"database.connection=" + dbURL,
		"database.auto_migrate=true",
		"api.listen=127.0.0.1:0",
		"api.token_file=" + tokens,
		"notifications.queue=" + testsvc.Name("vgpu-test-notifications"),
		"placement.endpoint_override=" + testsvc.PlacementURL(t),
		"placement.token_file=" + placementToken,
		"policy.rules_file=" + filepath.Join(etc, "rules.yaml"),
		"policy.profiles_file=" + filepath.Join(etc, "profiles.yaml"),
		"policy.driver_compat_file=" + filepath.Join(etc, "driver-compat.yaml"),
	}, append(testkeys.For(t).Bridge(), extra...)...)
}

// Config loads a full bridge configuration (see Overrides).
func Config(t testing.TB, dbURL string, extra ...string) *conf.Values {
	t.Helper()
	v, err := bridge.LoadConfig(conf.Source{Overrides: Overrides(t, dbURL, extra...)})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Start runs the bridge until the test ends, failing the test if it does
// not start within a minute or does not stop cleanly.
func Start(t testing.TB, v *conf.Values) *bridge.Daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *bridge.Daemon, 1)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, v, nil, func(d *bridge.Daemon) { started <- d }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("bridge.Run returned %v on shutdown", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("bridge did not shut down within 30s")
		}
	})
	var d *bridge.Daemon
	select {
	case d = <-started:
	case err := <-done:
		t.Fatalf("bridge stopped at start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("bridge did not start within 60s")
	}
	// Ready means the database and broker answer and the first full
	// Placement sync is done, so decisions see the fleet.
	url := "http://" + d.API.Addr() + "/readyz"
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("bridge not ready within 2m: %s", body)
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("bridge not ready within 2m: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Proc is vgpu-bridge run as a subprocess (the binary testsvc.Binary
// builds), for tests that kill it with SIGKILL and start it again on the
// same database and queues.
type Proc struct {
	t       testing.TB
	args    []string
	addr    string
	logPath string
	cmd     *exec.Cmd
	// Peaks are the peak resident sets (VmHWM) of the processes killed.
	Peaks []string
}

// NewProc prepares a bridge subprocess on dbURL with Overrides and extra
// settings, and file as its configuration file ("" for none). Start runs
// it.
func NewProc(t testing.TB, dbURL, file string, extra ...string) *Proc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &Proc{t: t, addr: addr, logPath: filepath.Join(t.TempDir(), "bridge.log"), args: []string{"serve", "--config", file}}
	for _, s := range Overrides(t, dbURL, append(extra, "api.listen="+addr)...) {
		p.args = append(p.args, "--set", s)
	}
	return p
}

// URL is the base URL of the process's API.
func (p *Proc) URL() string { return "http://" + p.addr }

// Start runs the process and waits until it is ready (2 minutes at most).
func (p *Proc) Start() {
	t := p.t
	t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testsvc.Binary(t, "vgpu-bridge"), p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start vgpu-bridge: %v", err)
	}
	logf.Close()
	p.cmd = cmd
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }) //nolint:errcheck
	p.WaitReadyz(http.StatusOK, 2*time.Minute)
}

// WaitReadyz polls /readyz until it answers status, and returns the
// problem's detail (which dependency is unreachable).
func (p *Proc) WaitReadyz(status int, within time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if resp, err := http.Get(p.URL() + "/readyz"); err == nil {
			var pd struct {
				Detail string `json:"detail"`
			}
			json.NewDecoder(resp.Body).Decode(&pd) //nolint:errcheck
			resp.Body.Close()
			if resp.StatusCode == status {
				return pd.Detail
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("/readyz did not answer %d within %s:\n%s", status, within, p.Log(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill9 kills the process with SIGKILL, as a power loss, after noting its
// peak resident set.
func (p *Proc) Kill9() {
	p.Peaks = append(p.Peaks, peakRSS(p.cmd.Process.Pid))
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		p.t.Fatalf("kill -9: %v", err)
	}
	p.cmd.Wait() //nolint:errcheck
}

// Log returns the last n lines the processes wrote.
func (p *Proc) Log(n int) string {
	b, _ := os.ReadFile(p.logPath)
	return testsvc.LastLines(string(b), n)
}

// peakRSS is a process's peak resident set (VmHWM), as "123 MiB".
func peakRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return fmt.Sprintf("%d MiB", kb/1024)
		}
	}
	return "?"
}

// PeakNow is the running process's peak resident set so far.
func (p *Proc) PeakNow() string { return peakRSS(p.cmd.Process.Pid) }

// FreeAddr is a free 127.0.0.1 port for a bridge's API to listen on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Subprocess is a bridge process started by Spawn.
type Subprocess struct {
	Cmd  *exec.Cmd
	Done <-chan struct{} // closed once it has exited
	URL  string          // its API
}

// Spawn runs vgpu-bridge with args, its API listening on addr, its
// output appended to logPath, and failpoint fp armed when not ""
// (internal/failpoint); it waits until /readyz answers 200, for 2 minutes
// at most, and fails the test at once if the process exits first. The
// process group is killed when the test ends.
func Spawn(t testing.TB, addr string, args []string, logPath, fp string) *Subprocess {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(logf, "----- bridge, failpoint %q -----\n", fp)
	if !slices.Contains(args, "--config") {
		// Never the machine's /etc/vgpu-bridge/bridge.conf, the default:
		// tests/keystone's TestInstall puts the package's there (Keystone
		// authentication) while other packages' tests run.
		args = append(slices.Clone(args), "--config", "")
	}
	cmd := exec.Command(testsvc.Binary(t, "vgpu-bridge"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), failpoint.Env+"="+fp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start vgpu-bridge: %v", err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
		<-done
	})
	sp := &Subprocess{Cmd: cmd, Done: done, URL: "http://" + addr}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("vgpu-bridge exited at start: %v\n%s", cmd.ProcessState, testsvc.LastLines(string(b), 30))
		default:
		}
		if resp, err := http.Get(sp.URL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return sp
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the bridge subprocess was not ready within 2 minutes\n%s", testsvc.LastLines(string(b), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
