package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// onJournal reports whether w is the stream systemd connected to
// journald for this service: $JOURNAL_STREAM names that stream's device
// and inode ("DEV:INO"), and w is the open file with both. A process whose
// standard error was redirected elsewhere (a pipe, a file) sees a
// different inode even when it inherited the variable. (go-systemd's
// journal.StderrIsJournalStream asks the same of file descriptor 2 only;
// this asks it of the file the logger writes to, which tests choose.)
func onJournal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	dev, ino, ok := strings.Cut(os.Getenv("JOURNAL_STREAM"), ":")
	if !ok {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	d, err1 := strconv.ParseUint(dev, 10, 64)
	i, err2 := strconv.ParseUint(ino, 10, 64)
	return err1 == nil && err2 == nil && uint64(st.Dev) == d && st.Ino == i
}

// syslogPriority is the syslog priority journald gives a line of level l.
func syslogPriority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3 // err
	case l >= slog.LevelWarn:
		return 4 // warning
	case l >= slog.LevelInfo:
		return 6 // info
	default:
		return 7 // debug
	}
}

// priorityHandler writes each record of inner with the "<N>" prefix that
// journald reads as the line's syslog priority (sd-daemon(3); the
// default SyslogLevelPrefix=yes), so `journalctl -p err` shows errors.
// The standard handlers write a record in one Write; the prefix goes in
// the same Write.
type priorityHandler struct {
	inner slog.Handler
	out   *prefixWriter
}

// prefixWriter puts the next record's prefix before its line.
type prefixWriter struct {
	mu     sync.Mutex // one record at a time: the prefix is the record's
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(append(p.buf[:0], p.prefix...), b...)
	if _, err := p.w.Write(p.buf); err != nil {
		return 0, err
	}
	return len(b), nil
}

func newPriorityHandler(w io.Writer, build func(io.Writer) slog.Handler) *priorityHandler {
	out := &prefixWriter{w: w}
	return &priorityHandler{inner: build(out), out: out}
}

func (h *priorityHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *priorityHandler) Handle(ctx context.Context, r slog.Record) error {
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	h.out.prefix = fmt.Sprintf("<%d>", syslogPriority(r.Level))
	return h.inner.Handle(ctx, r)
}

func (h *priorityHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &priorityHandler{inner: h.inner.WithAttrs(as), out: h.out}
}

func (h *priorityHandler) WithGroup(name string) slog.Handler {
	return &priorityHandler{inner: h.inner.WithGroup(name), out: h.out}
}
