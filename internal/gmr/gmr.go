// Package gmr writes a Guru Meditation Report, as oslo.reports does for
// OpenStack services: a plain-text snapshot of a running daemon (version,
// uptime, configuration, goroutines, runtime statistics and whatever its
// components add), written on demand without stopping anything.
//
// A component adds a Section; the daemon writes the report on SIGUSR2
// (package internal/daemon).
package gmr

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"time"
)

// Section is one titled part of the report. Write must not block for long
// (a section that queries something gives itself a short timeout) and must
// never print a secret.
type Section struct {
	Name  string
	Write func(w io.Writer)
}

// Report is the set of sections, in the order they were added.
type Report struct {
	mu       sync.Mutex
	title    string
	sections []Section
}

// New returns a report titled title ("vgpu-bridge") with no section.
func New(title string) *Report { return &Report{title: title} }

// Add adds sections; safe while the report is being written.
func (r *Report) Add(s ...Section) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sections = append(r.sections, s...)
}

// Begin and End mark the report's first and last lines.
const (
	Begin = "==== Guru Meditation Report"
	End   = "==== End of Guru Meditation Report"
)

// Bytes renders the report at now.
func (r *Report) Bytes(now time.Time) []byte {
	r.mu.Lock()
	secs := append([]Section(nil), r.sections...)
	r.mu.Unlock()
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s: %s at %s ====\n", Begin, r.title, now.UTC().Format(time.RFC3339))
	for _, s := range secs {
		fmt.Fprintf(&b, "\n==== %s ====\n", s.Name)
		var sb bytes.Buffer
		s.Write(&sb)
		out := sb.Bytes()
		b.Write(out)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	fmt.Fprintf(&b, "\n%s: %s ====\n", End, r.title)
	return b.Bytes()
}

// Goroutines is the stack of every goroutine.
func Goroutines() Section {
	return Section{Name: "Goroutines", Write: func(w io.Writer) {
		fmt.Fprintf(w, "count: %d\n\n", runtime.NumGoroutine())
		_ = pprof.Lookup("goroutine").WriteTo(w, 2)
	}}
}

// Runtime is the Go runtime's memory and collector statistics.
func Runtime() Section {
	return Section{Name: "Go runtime", Write: func(w io.Writer) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		mib := func(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
		rows := [][2]string{
			{"go", runtime.Version()},
			{"gomaxprocs", fmt.Sprint(runtime.GOMAXPROCS(0))},
			{"goroutines", fmt.Sprint(runtime.NumGoroutine())},
			{"heap_alloc", mib(m.HeapAlloc)},
			{"heap_inuse", mib(m.HeapInuse)},
			{"heap_idle", mib(m.HeapIdle)},
			{"heap_released", mib(m.HeapReleased)},
			{"heap_objects", fmt.Sprint(m.HeapObjects)},
			{"sys", mib(m.Sys)},
			{"total_alloc", mib(m.TotalAlloc)},
			{"gc_cycles", fmt.Sprint(m.NumGC)},
			{"gc_next_target", mib(m.NextGC)},
			{"gc_pause_total", time.Duration(m.PauseTotalNs).String()},
			{"gc_cpu_fraction", fmt.Sprintf("%.4f", m.GCCPUFraction)},
		}
		if m.NumGC > 0 {
			rows = append(rows,
				[2]string{"gc_last", time.Unix(0, int64(m.LastGC)).UTC().Format(time.RFC3339)},
				[2]string{"gc_last_pause", time.Duration(m.PauseNs[(m.NumGC+255)%256]).String()})
		}
		Table(w, rows)
	}}
}

// Table writes rows as aligned "name: value" lines.
func Table(w io.Writer, rows [][2]string) {
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0]))
	}
	for _, r := range rows {
		fmt.Fprintf(w, "%s:%s %s\n", r[0], strings.Repeat(" ", width-len(r[0])), r[1])
	}
}
