package policyreplay

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// JSONWriter streams a replay as one JSON document,
// {"events": [...], "summary": {...}}, an event at a time: a long window
// is never held in memory. An error that ends the replay after the first
// event is written as "error" next to the summary.
type JSONWriter struct {
	w   io.Writer
	n   int
	err error
}

// NewJSONWriter writes to w.
func NewJSONWriter(w io.Writer) *JSONWriter { return &JSONWriter{w: w} }

// Event writes one event.
func (j *JSONWriter) Event(ev Event) error {
	if j.err != nil {
		return j.err
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	sep := ",\n"
	if j.n == 0 {
		sep = "{\"events\": [\n"
	}
	j.n++
	_, j.err = fmt.Fprintf(j.w, "%s%s", sep, b)
	return j.err
}

// Close ends the document with the summary, and cause when the replay
// ended early.
func (j *JSONWriter) Close(sum Summary, cause error) error {
	if j.err != nil {
		return j.err
	}
	b, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	head := "\n],\n"
	if j.n == 0 {
		head = "{\"events\": [],\n"
	}
	tail := "}\n"
	if cause != nil {
		e, _ := json.Marshal(cause.Error())
		tail = ",\n\"error\": " + string(e) + "}\n"
	}
	_, j.err = fmt.Fprintf(j.w, "%s\"summary\": %s%s", head, b, tail)
	return j.err
}

// TableWriter writes a replay for people: a line per event with the
// intents of the rules in force and of the candidate side by side, then
// the summary.
type TableWriter struct {
	w io.Writer
	// OnlyDiffering leaves out the events both decide alike.
	OnlyDiffering bool
	n             int
	err           error
}

// NewTableWriter writes to w.
func NewTableWriter(w io.Writer) *TableWriter { return &TableWriter{w: w} }

const tableRow = "%-8s %-20s %-28s %-36s %-40s %-40s %s\n"

// Event writes one event.
func (t *TableWriter) Event(ev Event) error {
	if t.err != nil {
		return t.err
	}
	if t.OnlyDiffering && len(ev.Differs) == 0 && ev.Error == "" {
		return nil
	}
	if t.n == 0 {
		t.printf(tableRow, "EVENT", "TIME", "KIND", "INSTANCE", "IN FORCE", "CANDIDATE", "DIFFERS")
	}
	t.n++
	inst := ev.Instance
	if inst == "" {
		inst = "-"
	}
	at := ev.Time.UTC().Format(time.RFC3339)
	if ev.Error != "" {
		t.printf(tableRow, fmt.Sprint(ev.ID), at, ev.Kind, inst, "ERROR", "ERROR", ev.Error)
		return t.err
	}
	diff := "-"
	if len(ev.Differs) > 0 {
		diff = strings.Join(ev.Differs, ",")
	}
	t.printf(tableRow, fmt.Sprint(ev.ID), at, ev.Kind, inst, render(ev.Active), render(ev.Candidate), diff)
	return t.err
}

func (t *TableWriter) printf(format string, a ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, format, a...)
	}
}

// render is one side's cell: its intents, or its rejection, holds and
// rule errors; "-" when it decides nothing.
func render(s *Side) string {
	var parts []string
	for _, in := range s.Intents {
		if in.Kind == "reject" && s.Rejected {
			continue // shown as the rejection
		}
		parts = append(parts, Summarize(in))
	}
	if s.Rejected {
		parts = append(parts, fmt.Sprintf("rejected(%q)", s.Reason))
	}
	for _, h := range s.Held {
		parts = append(parts, "held("+h.Rule+" until "+h.Until.UTC().Format(time.RFC3339)+")")
	}
	for _, e := range s.RuleErrors {
		parts = append(parts, "error("+e+")")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// Close writes the summary, and cause when the replay ended early.
func (t *TableWriter) Close(sum Summary, cause error) error {
	if t.err != nil {
		return t.err
	}
	if t.n == 0 {
		t.printf("no event to show\n")
	}
	t.printf("\nreplayed %s to %s: policy in force %s, candidate %s\n", sum.Since.Format(time.RFC3339), sum.Until.Format(time.RFC3339),
		sum.ActivePolicy, sum.CandidatePolicy)
	t.printf("events: %d read, %d evaluated, %d failed, %d differ\n", sum.Events, sum.Evaluated, sum.Failed, sum.Differing)
	var d []string
	for _, k := range Kinds {
		d = append(d, fmt.Sprintf("%s %d", k, sum.Differ[k]))
	}
	t.printf("would differ: %s\n", strings.Join(d, ", "))
	if sum.RuleErrors["active"]+sum.RuleErrors["candidate"] > 0 {
		t.printf("rule conditions that could not be evaluated: in force %d, candidate %d\n", sum.RuleErrors["active"], sum.RuleErrors["candidate"])
	}
	for _, f := range sum.Failures {
		t.printf("failed event %d: %s\n", f.ID, f.Reason)
	}
	if sum.Failed > len(sum.Failures) {
		t.printf("(%d more failed events not listed)\n", sum.Failed-len(sum.Failures))
	}
	if sum.Truncated {
		t.printf("truncated: the window holds more than %d events; narrow it or raise --max-events\n", sum.MaxEvents)
	}
	if cause != nil {
		t.printf("replay ended early: %v\n", cause)
	}
	return t.err
}
