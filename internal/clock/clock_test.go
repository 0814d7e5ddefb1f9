package clock

import (
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	now := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	tol := 5 * time.Minute
	for _, c := range []struct {
		name string
		t    time.Time
		want bool
	}{
		{"now", now, true},
		{"at +tol", now.Add(tol), true},
		{"at -tol", now.Add(-tol), true},
		{"just past +tol", now.Add(tol + time.Second), false},
		{"just past -tol", now.Add(-tol - time.Second), false},
		{"30 days ahead", now.AddDate(0, 0, 30), false},
		{"300 years ahead", now.AddDate(300, 0, 0), false},
		{"300 years behind", now.AddDate(-300, 0, 0), false},
		{"year 9999", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), false},
		{"unix max seconds", time.Unix(1<<62, 0), false},
		{"unix min seconds", time.Unix(-1<<62, 0), false},
		{"zero time", time.Time{}, false},
	} {
		if got := Within(c.t, now, tol); got != c.want {
			t.Errorf("%s: Within = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestClamp(t *testing.T) {
	lo := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hi := lo.Add(time.Hour)
	for _, c := range []struct{ in, want time.Time }{
		{lo.Add(time.Minute), lo.Add(time.Minute)},
		{lo.AddDate(-300, 0, 0), lo},
		{hi.AddDate(300, 0, 0), hi},
		{time.Time{}, lo},
	} {
		if got := Clamp(c.in, lo, hi); !got.Equal(c.want) {
			t.Errorf("Clamp(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if got := Clamp(lo, hi, lo); !got.Equal(lo) {
		t.Errorf("lo after hi: got %v, want hi", got)
	}
}

func TestOffset(t *testing.T) {
	now := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		t    time.Time
		want string
	}{
		{now.Add(6 * time.Minute), "6m0s ahead"},
		{now.Add(-time.Hour), "1h0m0s behind"},
		{now.AddDate(300, 0, 0), "more than 290 years ahead"},
		{now.AddDate(-300, 0, 0), "more than 290 years behind"},
	} {
		if got := Offset(c.t, now); got != c.want {
			t.Errorf("Offset(%v) = %q, want %q", c.t, got, c.want)
		}
	}
}
