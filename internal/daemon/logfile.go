package daemon

import (
	"fmt"
	"os"
	"sync"
)

// watchedFile appends to the file at path and opens it again when the
// path no longer names the file it has open (moved or removed by
// logrotate), as Python's WatchedFileHandler that oslo.log's
// watch_log_file uses: one stat per record.
type watchedFile struct {
	mu   sync.Mutex
	path string
	f    *os.File
	st   os.FileInfo
}

func openWatched(path string) (*watchedFile, error) {
	w := &watchedFile{path: path}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *watchedFile) open() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("log file: %w", err)
	}
	if w.f != nil {
		w.f.Close()
	}
	w.f, w.st = f, st
	return nil
}

func (w *watchedFile) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st, err := os.Stat(w.path); err != nil || !os.SameFile(st, w.st) {
		if err := w.open(); err != nil {
			// Keep writing to the open file rather than lose the line.
			fmt.Fprintln(os.Stderr, err)
		}
	}
	return w.f.Write(b)
}

// Close closes the open file.
func (w *watchedFile) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}
