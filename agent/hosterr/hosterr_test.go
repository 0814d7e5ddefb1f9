package hosterr

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

func TestCodeOf(t *testing.T) {
	base := New(NotFound, "remove mdev x", fs.ErrNotExist)
	wrapped := fmt.Errorf("command 7: %w", base)
	tests := []struct {
		err  error
		want Code
	}{
		{nil, ""},
		{errors.New("boom"), Internal},
		{base, NotFound},
		{wrapped, NotFound},
	}
	for _, tc := range tests {
		if got := CodeOf(tc.err); got != tc.want {
			t.Errorf("CodeOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	if !errors.Is(wrapped, ErrNotFound) || errors.Is(wrapped, ErrExists) {
		t.Error("errors.Is against sentinels is wrong")
	}
	if !errors.Is(wrapped, fs.ErrNotExist) {
		t.Error("cause lost")
	}
	if got, want := wrapped.Error(), "command 7: remove mdev x: file does not exist"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestLabels(t *testing.T) {
	if NvidiaCode(NoCapacity) != 48 || NvidiaCode(VFIOUnavailable) != 62 || NvidiaCode(NotFound) != 0 {
		t.Error("NVIDIA labels wrong")
	}
	for _, c := range []Code{Exists, NotFound, NoCapacity, InUse, Unsupported, VFIOUnavailable, DomainNotRunning, Invalid, PermissionDenied, NVMLUnavailable, Timeout} {
		if Remediation(c) == "" {
			t.Errorf("no remediation for %s", c)
		}
	}
}
