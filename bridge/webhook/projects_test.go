package webhook

import (
	"testing"
	"time"
)

// A request naming instances of several projects takes a token of each,
// or none when one of them has none left.
func TestProjectLimitersAllOrNothing(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := newProjectLimiters(0.001, 2, func() time.Time { return now })
	for i, tc := range []struct {
		projects []string
		ok       bool
	}{
		{[]string{"a"}, true},
		{[]string{"a", "b"}, true},  // a's last token, b's first
		{[]string{"b", "a"}, false}, // a has none: b's is not spent
		{[]string{"b"}, true},       // b's second
		{[]string{"b"}, false},
		{[]string{"c"}, true}, // another project is not held back
		{nil, true},           // no known project: no limit
	} {
		ok, wait := l.allow(tc.projects, false)
		if ok != tc.ok {
			t.Fatalf("step %d %v: allowed = %v, want %v", i, tc.projects, ok, tc.ok)
		}
		if !ok && wait <= 0 {
			t.Errorf("step %d: refused without a wait", i)
		}
	}
	// Taken all the same: accepted, and b's bucket in debt.
	if ok, _ := l.allow([]string{"b"}, true); !ok {
		t.Error("always: refused")
	}
	if ok, wait := l.allow([]string{"b"}, false); ok || wait < 1000*time.Second {
		t.Errorf("after the debt: allowed %v, wait %s; want refused for over 1000 s (two tokens at 0.001/s)", ok, wait)
	}
	if newProjectLimiters(0, 10, time.Now) != nil {
		t.Error("rate 0 should turn the limit off")
	}
	var off *projectLimiters
	if ok, _ := off.allow([]string{"a"}, false); !ok {
		t.Error("no limiter refused")
	}
}
