package nova

import (
	"bytes"
	"fmt"
	"time"
)

// Layouts of oslo.messaging's "timestamp" (Python's str(datetime.utcnow())):
// microseconds are printed only when they are not zero.
const (
	osloLayout     = "2006-01-02 15:04:05.999999"
	osloLayoutFull = "2006-01-02 15:04:05.000000"
	osloLayoutSecs = "2006-01-02 15:04:05"
)

// ParseTimestamp parses a notification timestamp as oslo.messaging writes it:
// "YYYY-MM-DD HH:MM:SS.ffffff" in UTC without a zone, and without the fraction
// when the microseconds are 0. It also accepts a "T" separator and an RFC 3339
// zone suffix, which some tools write.
func ParseTimestamp(s string) (time.Time, error) {
	// A "T" separator never fits the oslo layout: skip that try (and the
	// error it allocates) for the payloads' RFC 3339 times.
	if len(s) <= 10 || s[10] != 'T' {
		if t, err := time.ParseInLocation(osloLayout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.ParseInLocation("2006-01-02T15:04:05.999999", s, time.UTC); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("timestamp %q: want YYYY-MM-DD HH:MM:SS[.ffffff]", s)
}

// FormatTimestamp writes t as Python's str(utcnow()) does.
func FormatTimestamp(t time.Time) string {
	t = t.UTC()
	if t.Nanosecond()/1000 == 0 {
		return t.Format(osloLayoutSecs)
	}
	return t.Truncate(time.Microsecond).Format(osloLayoutFull)
}

// Time is a timestamp inside a payload (ISO 8601 such as
// "2012-10-29T13:42:11Z", or null). The zero Time means null.
type Time struct{ time.Time }

// UnmarshalJSON accepts null, RFC 3339 and the oslo layout.
func (t *Time) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		t.Time = time.Time{}
		return nil
	}
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return fmt.Errorf("time: want a string, got %.40s", b)
	}
	s := string(b[1 : len(b)-1])
	if s == "" {
		t.Time = time.Time{}
		return nil
	}
	v, err := ParseTimestamp(s)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// MarshalJSON writes RFC 3339 or null.
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return []byte(`"` + t.UTC().Format(time.RFC3339Nano) + `"`), nil
}

// Ptr returns nil for a null Time, else a pointer to its time.
func (t Time) Ptr() *time.Time {
	if t.IsZero() {
		return nil
	}
	v := t.Time
	return &v
}
