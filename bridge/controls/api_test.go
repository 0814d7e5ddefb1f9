package controls

import (
	"strings"
	"testing"
)

func TestCursor(t *testing.T) {
	for _, id := range []int64{0, 1, 42, 1 << 40} {
		got, ok := decodeCursor(encodeCursor(id))
		if !ok || got != id {
			t.Errorf("cursor of %d decodes to %d, %v", id, got, ok)
		}
	}
	for _, bad := range []string{"!", "e30", encodeCursor(-1)[:3], "eyJrIjoiLTEifQ"} { // "{}", {"k":"-1"}
		if _, ok := decodeCursor(bad); ok {
			t.Errorf("cursor %q accepted", bad)
		}
	}
}

func TestCheckReason(t *testing.T) {
	tests := []struct {
		reason   string
		required bool
		bad      bool
	}{
		{"maintenance", true, false},
		{"", false, false},
		{"  ", true, true},
		{"", true, true},
		{strings.Repeat("x", MaxReasonBytes+1), false, true},
	}
	for _, tt := range tests {
		if got := checkReason(tt.reason, tt.required); (len(got) > 0) != tt.bad {
			t.Errorf("checkReason(%.10q, %v) = %v, want bad=%v", tt.reason, tt.required, got, tt.bad)
		}
	}
}
