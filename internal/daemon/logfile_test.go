package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// TestDaemonLoggerToLogFile: with [DEFAULT] log_file the daemon's lines go
// to the file, not standard error, and after logrotate moves the file the
// next line goes to a new file at the same path.
func TestDaemonLoggerToLogFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "testd.log")
	spec := testSpec()
	spec.LogFile = func(*conf.Values) string { return path }
	var stderr strings.Builder
	g := &Globals{Spec: spec, Stderr: &stderr}
	v, err := g.Load()
	if err != nil {
		t.Fatal(err)
	}
	log, closeLog, err := g.DaemonLogger(v)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	log.Info("before rotation")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	log.Info("after rotation")
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if old := read(path + ".1"); !strings.Contains(old, "before rotation") || strings.Contains(old, "after rotation") {
		t.Errorf("rotated file: %q", old)
	}
	if cur := read(path); !strings.Contains(cur, "after rotation") || strings.Contains(cur, "before rotation") {
		t.Errorf("new file: %q", cur)
	}
	if stderr.Len() != 0 {
		t.Errorf("standard error got %q", stderr.String())
	}
	if _, _, err := g.DaemonLogger(v); err != nil {
		t.Errorf("second open: %v", err)
	}
	spec.LogFile = func(*conf.Values) string { return filepath.Join(dir, "missing", "x.log") }
	g.Spec = spec
	if _, _, err := g.DaemonLogger(v); err == nil || !strings.Contains(err.Error(), "log file") {
		t.Errorf("unwritable log_file: %v", err)
	}
}
