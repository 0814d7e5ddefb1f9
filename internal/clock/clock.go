// Package clock bounds times that come from outside the bridge (Nova's
// notification timestamps, a webhook's signed timestamp) against the
// bridge's own clock.
//
// Such a time may be anything a sender writes, up to the year 9999 and
// beyond what a time.Duration holds (about 292 years): now.Sub(t) then
// saturates, and -now.Sub(t) of the most negative Duration is itself, so a
// check written as `d > tol || -d > tol` passes a time centuries ahead.
// The functions here compare time.Time values and never take a
// difference of an unbounded time, so they hold for every t.
package clock

import (
	"fmt"
	"time"
)

// Within reports whether t lies in [now-tol, now+tol]. tol is the
// caller's own setting (bounded by its option), so now±tol cannot
// overflow.
func Within(t, now time.Time, tol time.Duration) bool {
	return !t.Before(now.Add(-tol)) && !t.After(now.Add(tol))
}

// Clamp returns t bounded into [lo, hi]; hi wins when lo is after hi.
func Clamp(t, lo, hi time.Time) time.Time {
	if t.Before(lo) {
		t = lo
	}
	if t.After(hi) {
		t = hi
	}
	return t
}

// Offset describes how far t is from now for an error message: "6m0s
// ahead", "1h0m0s behind", or "more than 290 years ahead" where the
// difference does not fit a Duration.
func Offset(t, now time.Time) string {
	const far = 290 * 365 * 24 * time.Hour
	switch {
	case t.After(now.Add(far)):
		return "more than 290 years ahead"
	case t.Before(now.Add(-far)):
		return "more than 290 years behind"
	case t.After(now):
		return fmt.Sprintf("%s ahead", t.Sub(now).Round(time.Second))
	default:
		return fmt.Sprintf("%s behind", now.Sub(t).Round(time.Second))
	}
}
