package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestJournalPriorities: on journald's stream ($JOURNAL_STREAM names
// standard error's device and inode) each line starts with its syslog
// priority, which journald stores as the entry's PRIORITY; anywhere else
// the lines are as they were.
func TestJournalPriorities(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	log := func() {
		build := func(w io.Writer) slog.Handler {
			return slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})
		}
		var l *slog.Logger
		if onJournal(f) {
			l = slog.New(newPriorityHandler(f, build))
		} else {
			l = slog.New(build(f))
		}
		l = l.With("component", "test")
		l.Debug("d")
		l.Info("i")
		l.Warn("w")
		l.WithGroup("g").Error("e", "k", 1)
	}
	read := func() []string {
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(0) //nolint:errcheck
		f.Seek(0, 0)  //nolint:errcheck
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}

	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	log()
	lines := read()
	if len(lines) != 4 {
		t.Fatalf("%d lines: %q", len(lines), lines)
	}
	for i, want := range []string{`<7>{`, `<6>{`, `<4>{`, `<3>{`} {
		if !strings.HasPrefix(lines[i], want) || !strings.Contains(lines[i], `"component":"test"`) {
			t.Errorf("line %d = %q, want it to start %q and keep its attributes", i, lines[i], want)
		}
	}

	// Another stream (standard error redirected, the variable inherited).
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1))
	log()
	for _, l := range read() {
		if strings.HasPrefix(l, "<") {
			t.Errorf("line %q carries a priority off the journal", l)
		}
	}
}
