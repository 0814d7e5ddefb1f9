package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/gmr"
)

// fakeSystemd listens on a unixgram socket as systemd does for a
// service's notifications and sets $NOTIFY_SOCKET and $WATCHDOG_USEC.
func fakeSystemd(t *testing.T, watchdog time.Duration) <-chan string {
	dir, err := os.MkdirTemp("", "sd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "")
	if watchdog > 0 {
		t.Setenv("WATCHDOG_USEC", strconv.FormatInt(watchdog.Microseconds(), 10))
	}
	ch := make(chan string, 256)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			ch <- string(buf[:n])
		}
	}()
	return ch
}

func next(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10s")
		return ""
	}
}

func testGlobals(stderr io.Writer) *Globals {
	return &Globals{Spec: Spec{Name: "vgpu-test"}, Stderr: stderr}
}

func testValues(t *testing.T) *conf.Values {
	g := conf.NewGroup()
	g.Secret("database", "connection", "Database URL. Example: postgres://x")
	v, err := conf.NewSet("VGPU_TEST_", g).Load(conf.Source{Overrides: []string{"database.connection=postgres://u:hunter2@db/x"}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Pings start at READY=1 and go on through a dependency's outage, which
// only the status line tells (once as it starts, once as it ends); a
// health check that never returns (a hang) stops them, so systemd
// restarts the daemon; STOPPING=1 comes when the context ends.
func TestWatchdogPingsThroughOutagesNotHangs(t *testing.T) {
	ch := fakeSystemd(t, 200*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc := testGlobals(io.Discard).Serve(ctx, testValues(t), slog.New(slog.DiscardHandler))
	var sick, hung atomic.Bool
	var checks atomic.Int32
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		svc.Watchdog(ctx, func(context.Context) error {
			checks.Add(1)
			if hung.Load() {
				<-release // deaf to its deadline: a deadlock
			}
			if sick.Load() {
				return errors.New("database down")
			}
			return nil
		})
	}()
	// Nothing before READY=1, whatever the time.
	time.Sleep(300 * time.Millisecond)
	if checks.Load() != 0 {
		t.Errorf("health checked %d times before READY=1", checks.Load())
	}
	svc.Ready("serving")
	if s := next(t, ch); s != "READY=1\nSTATUS=serving" {
		t.Fatalf("first notification %q, want READY=1 with its status", s)
	}
	for range 3 {
		if s := next(t, ch); s != "WATCHDOG=1" {
			t.Fatalf("notification %q, want WATCHDOG=1", s)
		}
	}
	// An outage: the status says so once, and the pings go on.
	sick.Store(true)
	for s := next(t, ch); s != "STATUS=degraded: database down"; s = next(t, ch) {
		if s != "WATCHDOG=1" {
			t.Fatalf("notification %q while turning degraded", s)
		}
	}
	for range 3 {
		if s := next(t, ch); s != "WATCHDOG=1" {
			t.Fatalf("notification %q during the outage, want WATCHDOG=1 only", s)
		}
	}
	sick.Store(false)
	for s := next(t, ch); s != "STATUS=healthy"; s = next(t, ch) {
		if s != "WATCHDOG=1" {
			t.Fatalf("notification %q while recovering", s)
		}
	}
	if s := next(t, ch); s != "WATCHDOG=1" {
		t.Fatalf("notification %q, want WATCHDOG=1", s)
	}
	// A hang: no ping while the check does not return.
	hung.Store(true)
	n := checks.Load()
	for checks.Load() == n {
		time.Sleep(10 * time.Millisecond)
	}
	for len(ch) > 0 { // a ping sent before the hang began
		<-ch
	}
	select {
	case s := <-ch:
		t.Fatalf("notification %q while hung", s)
	case <-time.After(500 * time.Millisecond): // 2.5 ping periods
	}
	hung.Store(false)
	close(release)
	if s := next(t, ch); s != "WATCHDOG=1" {
		t.Fatalf("notification %q after the hang, want WATCHDOG=1", s)
	}
	cancel()
	<-done
	for s := next(t, ch); s != "STOPPING=1"; s = next(t, ch) {
		if s != "WATCHDOG=1" {
			t.Fatalf("notification %q, want STOPPING=1", s)
		}
	}
}

// Without $WATCHDOG_USEC, Watchdog returns at once and never checks.
func TestWatchdogOff(t *testing.T) {
	fakeSystemd(t, 0)
	svc := testGlobals(io.Discard).Serve(t.Context(), testValues(t), slog.New(slog.DiscardHandler))
	svc.Ready("serving")
	svc.Watchdog(t.Context(), func(context.Context) error { t.Error("health checked without a watchdog"); return nil })
}

// SIGUSR2 writes the report to standard error: the sections added, the
// configuration with secrets masked; the process goes on.
func TestReportOnSIGUSR2(t *testing.T) {
	fakeSystemd(t, 0)
	var out syncBuffer
	svc := testGlobals(&out).Serve(t.Context(), testValues(t), slog.New(slog.DiscardHandler))
	svc.Report.Add(gmr.Section{Name: "Widgets", Write: func(w io.Writer) { io.WriteString(w, "spinning: 3") }})
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), gmr.End) {
		if time.Now().After(deadline) {
			t.Fatalf("no report within 10s:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	rep := out.String()
	for _, want := range []string{gmr.Begin + ": vgpu-test", "==== Package ====", "name:", "uptime:",
		"==== Configuration ====", "[database] connection = *** (flag)", "==== Go runtime ====", "heap_alloc:",
		"==== Goroutines ====", "TestReportOnSIGUSR2", "==== Widgets ====\nspinning: 3\n"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
	if strings.Contains(rep, "hunter2") {
		t.Errorf("report shows the secret:\n%s", rep)
	}
}

// syncBuffer is standard error, written by the report's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
