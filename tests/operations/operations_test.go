// Package operations tests what operators see of a running daemon besides
// its API: systemd's readiness and watchdog notifications (Type=notify)
// and the Guru Meditation Report written on SIGUSR2. The daemons run as
// subprocesses, as systemd runs them, against the real local services.
package operations

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/gmr"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testsvc.RemoveBinaries()
	os.Exit(code)
}

// watchdogUsec is the WATCHDOG_USEC the tests give (systemd's
// WatchdogSec=): short, so that pings come several times a second.
const watchdogUsec = 600_000

// notification is one datagram the daemon sent to $NOTIFY_SOCKET.
type notification struct {
	state string
	at    time.Time
}

// notifySocket listens as systemd does for a service's notifications, on
// a unixgram socket, and passes each datagram on.
func notifySocket(t *testing.T) (string, <-chan notification) {
	t.Helper()
	dir, err := os.MkdirTemp("", "notify-") // short: a socket path has 108 bytes at most
	testsvc.Must(t, err, "socket dir")
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	testsvc.Must(t, err, "listen "+path)
	t.Cleanup(func() { conn.Close() })
	ch := make(chan notification, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(ch)
				return
			}
			ch <- notification{string(buf[:n]), time.Now()}
		}
	}()
	return path, ch
}

// proc is a daemon run as systemd would run a Type=notify unit.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	out    *lockedBuffer // its standard output and error
	done   chan struct{}
	notify <-chan notification
}

// lockedBuffer is the process's output, written by exec's copying
// goroutine and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start runs binary with args, $NOTIFY_SOCKET and $WATCHDOG_USEC set.
func start(t *testing.T, binary string, args ...string) *proc {
	t.Helper()
	sock, ch := notifySocket(t)
	out := &lockedBuffer{}
	cmd := exec.Command(testsvc.Binary(t, binary), args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock, fmt.Sprintf("WATCHDOG_USEC=%d", watchdogUsec))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	testsvc.Must(t, cmd.Start(), "start "+binary)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
		<-done
	})
	return &proc{t: t, cmd: cmd, out: out, done: done, notify: ch}
}

func (p *proc) output() string { return p.out.String() }

// next waits for the next notification, failing the test if the process
// exits first or none comes within d.
func (p *proc) next(d time.Duration) notification {
	p.t.Helper()
	select {
	case n := <-p.notify:
		return n
	case <-p.done:
		p.t.Fatalf("%s exited: %v\n%s", p.cmd.Path, p.cmd.ProcessState, testsvc.LastLines(p.output(), 30))
	case <-time.After(d):
		p.t.Fatalf("no notification within %s\n%s", d, testsvc.LastLines(p.output(), 30))
	}
	return notification{}
}

// waitReady waits for READY=1 (2 minutes at most) and returns its datagram;
// nothing but STATUS= may come before it (no watchdog ping before ready).
func (p *proc) waitReady() notification {
	p.t.Helper()
	for {
		n := p.next(2 * time.Minute)
		if hasLine(n.state, "READY=1") {
			return n
		}
		if hasLine(n.state, "WATCHDOG=1") {
			p.t.Fatalf("watchdog ping before READY=1: %q", n.state)
		}
	}
}

// pings collects the next k WATCHDOG=1 pings.
func (p *proc) pings(k int) []time.Time {
	p.t.Helper()
	var at []time.Time
	for len(at) < k {
		n := p.next(30 * time.Second)
		if hasLine(n.state, "WATCHDOG=1") {
			at = append(at, n.at)
		}
	}
	return at
}

// report sends SIGUSR2 and returns the report the process wrote.
func (p *proc) report() string {
	p.t.Helper()
	before := len(p.output())
	testsvc.Must(p.t, p.cmd.Process.Signal(syscall.SIGUSR2), "SIGUSR2")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := p.output()[before:]
		if i := strings.Index(out, gmr.Begin); i >= 0 {
			if j := strings.Index(out[i:], gmr.End); j >= 0 {
				return out[i : i+j]
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("the process exited on SIGUSR2: %v\n%s", p.cmd.ProcessState, testsvc.LastLines(p.output(), 30))
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no report within 30s of SIGUSR2:\n%s", testsvc.LastLines(p.output(), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and expects STOPPING=1, then a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	testsvc.Must(p.t, p.cmd.Process.Signal(syscall.SIGTERM), "SIGTERM")
	for {
		n := p.next(30 * time.Second)
		if hasLine(n.state, "STOPPING=1") {
			break
		}
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.t.Fatalf("did not exit within 60s of SIGTERM\n%s", testsvc.LastLines(p.output(), 30))
	}
	if !p.cmd.ProcessState.Success() {
		p.t.Errorf("exit after SIGTERM: %v, want 0\n%s", p.cmd.ProcessState, testsvc.LastLines(p.output(), 30))
	}
}

func hasLine(state, line string) bool {
	for _, l := range strings.Split(state, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// sections are the report's section titles, in order.
func sections(report string) []string {
	var out []string
	for _, l := range strings.Split(report, "\n") {
		if t, ok := strings.CutPrefix(l, "==== "); ok && !strings.HasPrefix(l, gmr.Begin) {
			out = append(out, strings.TrimSuffix(t, " ===="))
		}
	}
	return out
}

func checkSections(t *testing.T, report string, want ...string) {
	t.Helper()
	got := map[string]bool{}
	for _, s := range sections(report) {
		got[s] = true
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("report has no section %q (it has %q)", w, sections(report))
		}
	}
}

// checkPings checks that the pings come as often as the watchdog asks:
// the daemon pings every half WATCHDOG_USEC, so each gap must stay well
// below it for systemd not to kill it (the median, against a loaded test
// machine's scheduling).
func checkPings(t *testing.T, at []time.Time) {
	t.Helper()
	gaps := make([]time.Duration, 0, len(at)-1)
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	slices.Sort(gaps)
	if med := gaps[len(gaps)/2]; med >= watchdogUsec*time.Microsecond {
		t.Errorf("median gap between watchdog pings %s, want below WATCHDOG_USEC %s (gaps %v)",
			med, watchdogUsec*time.Microsecond, gaps)
	}
}

// TestBridgeNotifiesSystemdAndReports runs vgpu-bridge serve as a
// Type=notify unit with a watchdog: READY=1 comes once the API answers,
// WATCHDOG=1 as often as WATCHDOG_USEC asks, SIGUSR2 writes the report
// (every section, no secret) without stopping the bridge, and SIGTERM
// sends STOPPING=1. Then a vgpu-agent on a fake host, reporting to that
// bridge, does the same: READY=1 once connected and reported.
func TestBridgeNotifiesSystemdAndReports(t *testing.T) {
	const dbPassword = "Zq7-db-secret-41"
	// The local Postgres trusts its clients: a password in the URL is
	// sent only if asked for, and the bridge connects as well.
	u, err := url.Parse(testsvc.Postgres(t))
	testsvc.Must(t, err, "database URL")
	u.User = url.UserPassword(u.User.Username(), dbPassword)
	secretDB := u.String()
	transportURL := testsvc.TransportURL(t)
	addr := testbridge.FreeAddr(t)
	args := []string{"serve", "--config", ""}
	for _, s := range testbridge.Overrides(t, secretDB, "api.listen="+addr) {
		args = append(args, "--set", s)
	}
	b := start(t, "vgpu-bridge", args...)
	ready := b.waitReady()
	// At READY=1 the API answers already.
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("READY=1 came but the API does not answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz at READY=1: %d", resp.StatusCode)
	}
	if !strings.Contains(ready.state, "STATUS=serving the API on ") {
		t.Errorf("READY=1 without its STATUS= line: %q", ready.state)
	}
	checkPings(t, b.pings(6))

	rep := b.report()
	checkSections(t, rep, "Package", "Configuration", "Go runtime", "Goroutines",
		"Database pool", "Brokers", "Readiness checks")
	for _, want := range []string{
		"version:", "uptime:", "heap_alloc:", "gc_cycles:", "goroutine ", "max_conns:", "acquired_conns:",
		"[database] connection = *** (flag)", "[DEFAULT] transport_url = *** (flag)",
		"database:", // its readiness check
	} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, secret := range []string{dbPassword, transportURL, "guest:guest"} {
		if strings.Contains(rep, secret) {
			t.Errorf("report shows the secret %q", secret)
		}
	}
	if strings.Contains(b.output(), dbPassword) {
		t.Errorf("the bridge's output shows the database password")
	}
	// The bridge goes on: the API answers, the watchdog pings.
	if resp, err := http.Get("http://" + addr + "/healthz"); err != nil {
		t.Errorf("API after SIGUSR2: %v", err)
	} else {
		resp.Body.Close()
	}
	b.pings(2)

	t.Run("agent", func(t *testing.T) {
		host := testsvc.Name("ops")
		dir := t.TempDir()
		aargs := []string{"serve", "--config", "", "--fake-host", filepath.Join(dir, "fake")}
		for _, s := range append([]string{"DEFAULT.host=" + host, "DEFAULT.transport_url=" + transportURL,
			"DEFAULT.state_path=" + filepath.Join(dir, "state"), "DEFAULT.listen=127.0.0.1:0",
			"DEFAULT.log_format=text", "DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"},
			testkeys.For(t).Agent(host)...) {
			aargs = append(aargs, "--set", s)
		}
		a := start(t, "vgpu-agent", aargs...)
		ready := a.waitReady()
		if !strings.Contains(ready.state, "STATUS=connected to RabbitMQ; reported host "+host) {
			t.Errorf("READY=1 without its STATUS= line: %q", ready.state)
		}
		checkPings(t, a.pings(6))
		rep := a.report()
		checkSections(t, rep, "Package", "Configuration", "Go runtime", "Goroutines", "Agent", "RabbitMQ")
		for _, want := range []string{"connected:       true", "recovery:  done", "[DEFAULT] transport_url = *** (flag)"} {
			if !strings.Contains(rep, want) {
				t.Errorf("agent report lacks %q:\n%s", want, rep)
			}
		}
		if strings.Contains(rep, "reports_sent:    0\n") {
			t.Errorf("agent report: no report sent, yet READY=1 came")
		}
		for _, secret := range []string{transportURL, "guest:guest"} {
			if strings.Contains(rep, secret) {
				t.Errorf("agent report shows the secret %q", secret)
			}
		}
		a.stop()
	})
	b.stop()
}
