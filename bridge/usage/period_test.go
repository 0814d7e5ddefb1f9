package usage

import (
	"testing"
	"time"
)

func TestPeriod(t *testing.T) {
	at := time.Date(2026, 12, 5, 13, 47, 12, 345, time.FixedZone("CET", 3600)) // 12:47:12 UTC
	for _, tc := range []struct {
		period      string
		start, next string
	}{
		{"hour", "2026-12-05T12:00:00Z", "2026-12-05T13:00:00Z"},
		{"day", "2026-12-05T00:00:00Z", "2026-12-06T00:00:00Z"},
		{"month", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"year", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"Month", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"15m", "2026-12-05T12:45:00Z", "2026-12-05T13:00:00Z"},
		{"1m", "2026-12-05T12:47:00Z", "2026-12-05T12:48:00Z"},
		{"8h", "2026-12-05T08:00:00Z", "2026-12-05T16:00:00Z"},
	} {
		t.Run(tc.period, func(t *testing.T) {
			p, err := ParsePeriod(tc.period)
			if err != nil {
				t.Fatal(err)
			}
			start := p.Start(at)
			if got := start.Format(time.RFC3339); got != tc.start {
				t.Errorf("Start = %s, want %s", got, tc.start)
			}
			if got := p.Next(start).Format(time.RFC3339); got != tc.next {
				t.Errorf("Next = %s, want %s", got, tc.next)
			}
			if !p.Start(p.Next(start)).Equal(p.Next(start)) {
				t.Errorf("the next period's start is not a period start")
			}
		})
	}
}

func TestParsePeriodRefuses(t *testing.T) {
	for _, s := range []string{"", "week", "30s", "7h", "-1h", "fortnight", "25h"} {
		if _, err := ParsePeriod(s); err == nil {
			t.Errorf("ParsePeriod(%q) accepted", s)
		}
	}
}

// A month's length follows the calendar, across a year's end and a leap
// February.
func TestMonthLengths(t *testing.T) {
	p, _ := ParsePeriod("month")
	for _, tc := range []struct {
		at   string
		days int
	}{{"2028-02-10T00:00:00Z", 29}, {"2027-02-10T00:00:00Z", 28}, {"2026-12-31T23:59:59Z", 31}} {
		at, _ := time.Parse(time.RFC3339, tc.at)
		s := p.Start(at)
		if got := int(p.Next(s).Sub(s).Hours() / 24); got != tc.days {
			t.Errorf("month of %s: %d days, want %d", tc.at, got, tc.days)
		}
	}
}
