// Package usage is the vGPU accounting: vGPU-seconds per project,
// instance, profile and host from the usage intervals the request
// lifecycle keeps (package requests, vgpu_usage), GET /v1/usage, and the
// closing of audit periods with their vgpu.exists notifications, as
// Nova's instance usage audit closes its periods with instance.exists.
package usage

import (
	"fmt"
	"strings"
	"time"
)

// Period is an audit period: a calendar unit (hour, day, month, year, as
// Nova's instance_usage_audit_period) or a fixed length that divides a
// day (15m), all in UTC.
type Period struct {
	unit  string        // hour, day, month, year; "" for every
	every time.Duration // fixed length
}

// ParsePeriod reads "hour", "day", "month", "year" or a duration of at
// least a minute that divides 24h evenly ("15m", "2h").
func ParsePeriod(s string) (Period, error) {
	switch u := strings.ToLower(strings.TrimSpace(s)); u {
	case "hour", "day", "month", "year":
		return Period{unit: u}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Minute || (24*time.Hour)%d != 0 {
		return Period{}, fmt.Errorf("audit period %q: want hour, day, month, year or a duration of at least 1m that divides 24h (15m, 2h)", s)
	}
	return Period{every: d}, nil
}

// String is the period as ParsePeriod reads it.
func (p Period) String() string {
	if p.unit != "" {
		return p.unit
	}
	return p.every.String()
}

// Start is the beginning of the period holding t.
func (p Period) Start(t time.Time) time.Time {
	t = t.UTC()
	switch p.unit {
	case "hour":
		return t.Truncate(time.Hour)
	case "day":
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	case "month":
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	case "year":
		return time.Date(t.Year(), 1, 1, 0, 0, 0, 0, time.UTC)
	}
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return day.Add(t.Sub(day).Truncate(p.every))
}

// Next is the beginning of the period after the one starting at start.
func (p Period) Next(start time.Time) time.Time {
	start = start.UTC()
	switch p.unit {
	case "hour":
		return start.Add(time.Hour)
	case "day":
		return start.AddDate(0, 0, 1)
	case "month":
		return start.AddDate(0, 1, 0)
	case "year":
		return start.AddDate(1, 0, 0)
	}
	return start.Add(p.every)
}
