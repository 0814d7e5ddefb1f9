//go:build lab

package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// inVM: this process is the copy running inside the lab VM.
var inVM = os.Getenv("VGPU_LAB_VM") == "1"

var (
	labScript string // tests/lab/lab.sh
	labEnv    = map[string]string{}
	upErr     error
)

// cmdTimeout bounds one command in the VM: the VM is emulated (TCG) and shares
// the machine's CPUs, so a session can take tens of seconds on a busy host.
const cmdTimeout = 6 * time.Minute

func TestMain(m *testing.M) {
	if inVM {
		os.Exit(m.Run())
	}
	_, file, _, _ := runtime.Caller(0)
	labScript = filepath.Join(filepath.Dir(file), "lab.sh")
	upErr = up()
	if upErr != nil {
		fmt.Fprintf(os.Stderr, "lab: the lab VM did not start: %v\n"+
			"Start it by hand (as root) and read its serial console:\n"+
			"    make lab          # or: bash tests/lab/lab.sh up\n"+
			"    tail -n 100 %s\n", upErr, labEnv["LAB_SERIAL_LOG"])
	}
	os.Exit(m.Run()) // each test fails on upErr: none skips
}

// upTimeout bounds lab.sh up: on a fresh machine it installs its packages
// first (apt; on a busy two-core machine that took 17 minutes here, most of
// it Debian's initramfs triggers) and builds the modules.
const upTimeout = 30 * time.Minute

func up() error {
	ctx, cancel := context.WithTimeout(context.Background(), upTimeout)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", labScript, "up")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// On timeout, the whole group: killing bash alone left its apt or
	// module build running on.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Run(); err != nil {
		_ = readEnv()
		return fmt.Errorf("lab.sh up: %w", err)
	}
	fmt.Fprintf(os.Stderr, "lab: up after %s\n", time.Since(start).Round(time.Second))
	return readEnv()
}

func readEnv() error {
	out, err := exec.Command("bash", labScript, "env").Output()
	if err != nil {
		return fmt.Errorf("lab.sh env: %w", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			labEnv[k] = v
		}
	}
	return nil
}

// needLab fails t when the lab is not up (never skips).
func needLab(t *testing.T) {
	t.Helper()
	if inVM {
		t.Fatal("host-side test run inside the lab VM")
	}
	if upErr != nil {
		t.Fatalf("the lab is not up: %v (start it with `make lab`; see %s)", upErr, labEnv["LAB_SERIAL_LOG"])
	}
}

// vm runs a shell script in the VM as root and returns its combined output
// and exit error. When ssh itself could not reach the VM (exit status 255
// with ssh's own complaint and nothing else: a connection refused, reset
// or timed out while the emulated VM was starved of CPU), the script never
// ran, and vm tries again, three times at most.
func vm(t *testing.T, script string) (string, error) {
	t.Helper()
	for try := 1; ; try++ {
		out, err := vmOnce(script)
		if try == 3 || !sshUnreachable(out, err) {
			return out, err
		}
		t.Logf("ssh to the lab VM failed (%v: %s); trying again", err, strings.TrimSpace(out))
		time.Sleep(time.Duration(try) * 3 * time.Second)
	}
}

func vmOnce(script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", labScript, "ssh", script)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (after %s)", ctx.Err(), cmdTimeout)
	}
	return buf.String(), err
}

// sshUnreachable: ssh's exit status 255 with no output but ssh's own
// errors of a session that never opened (LogLevel=ERROR prints nothing
// else of its own). A connection lost mid-script is not retried.
var sshConnErr = regexp.MustCompile(`(?i)^(ssh: connect to host|kex_exchange_identification|connection (closed|reset|timed out)|mux_client|control socket|Timeout, server)`)

func sshUnreachable(out string, err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 255 {
		return false
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !sshConnErr.MatchString(l) {
			return false
		}
	}
	return true
}

// runInVM runs the test named name of this binary inside the VM against the
// VM's real /sys and fails t when it fails there.
func runInVM(t *testing.T, name string) {
	t.Helper()
	needLab(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	share := labEnv["LAB_SHARE_DIR"]
	if err := os.MkdirAll(filepath.Join(share, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(share, "bin", "lab.test")
	if err := copyFile(self, dst); err != nil {
		t.Fatal(err)
	}
	out, err := vm(t, fmt.Sprintf("VGPU_LAB_VM=1 %s/bin/lab.test -test.v -test.count=1 -test.run '^%s$' 2>&1",
		labEnv["LAB_VM_SHARE_DIR"], name))
	t.Logf("in the lab VM:\n%s", out)
	if err != nil {
		t.Fatalf("%s failed in the lab VM: %v", name, err)
	}
	if !strings.Contains(out, "--- PASS: "+name) {
		t.Fatalf("%s did not pass in the lab VM", name)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
