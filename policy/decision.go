package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Outcome is what happened to one rule during an evaluation.
type Outcome string

// Rule outcomes.
const (
	OutcomeFired    Outcome = "fired"    // condition held; its intents were produced
	OutcomeFalse    Outcome = "false"    // condition did not hold
	OutcomeHolding  Outcome = "holding"  // condition holds, but not yet for the rule's "for"
	OutcomeCooldown Outcome = "cooldown" // condition held long enough, but the instance changed too recently
	OutcomeError    Outcome = "error"    // condition could not be evaluated (e.g. a missing metric)
	OutcomeSkipped  Outcome = "skipped"  // not evaluated: an earlier final rule fired
)

// Value is a variable a rule's condition read, and its value.
type Value struct {
	Path  string `json:"path"`
	Value string `json:"value"`
}

// RuleTrace explains one rule of an evaluation.
type RuleTrace struct {
	Rule    string  `json:"rule"`
	Line    int     `json:"line"`
	Col     int     `json:"column"`
	Outcome Outcome `json:"outcome"`
	Values  []Value `json:"values,omitempty"`
	Detail  string  `json:"detail,omitempty"`
}

// LoadOp is a change to load-rule state.
type LoadOp string

// Load-state operations.
const (
	LoadArm    LoadOp = "arm"    // the rule's condition started to hold at At
	LoadClear  LoadOp = "clear"  // forget when it started (it stopped holding, or fired)
	LoadChange LoadOp = "change" // the instance's vGPUs change at At (starts the cooldown)
)

// LoadUpdate is written back to the LoadState after a decision is taken.
type LoadUpdate struct {
	Op       LoadOp    `json:"op"`
	Instance string    `json:"instance_uuid"`
	Rule     string    `json:"rule,omitempty"`
	At       time.Time `json:"at"`
}

// Decision is the answer to one event.
type Decision struct {
	Kind         string    `json:"event"`
	Instance     string    `json:"instance_uuid,omitempty"`
	Project      string    `json:"project_id,omitempty"`
	Time         time.Time `json:"time"`
	Policy       string    `json:"policy"` // Policy.Hash
	Preferred    string    `json:"preferred,omitempty"`
	PreferredWhy string    `json:"preferred_why,omitempty"`
	Intents      []Intent  `json:"intents"`
	Refused      []Refusal `json:"refused,omitempty"`
	Rejected     bool      `json:"rejected"`
	Reason       string    `json:"reason,omitempty"`
	// Code is the refused change's Refusal.Code when that refusal is the
	// rejection (RefusalQuota).
	Code        string       `json:"code,omitempty"`
	Rules       []RuleTrace  `json:"rules"`
	OtherRules  int          `json:"other_rules"` // rules listening to other event kinds
	LoadUpdates []LoadUpdate `json:"load_updates,omitempty"`
	// Held are the rules whose condition held but whose for: window or
	// cooldown held them back, each with when its hold ends: what they
	// would do is deferred, not dropped (Policy.EvaluateHeld).
	Held []Hold `json:"held,omitempty"`
}

// Hold is a rule an evaluation held back, and when its hold ends.
type Hold struct {
	Rule  string    `json:"rule"`
	Until time.Time `json:"until"`
}

// HeldRules returns the names of the rules held back, in rule order, and
// the earliest time a hold ends: when the event is due to be evaluated
// again. It returns nil and the zero time when nothing was held.
func (d *Decision) HeldRules() ([]string, time.Time) {
	var names []string
	var until time.Time
	for _, h := range d.Held {
		names = append(names, h.Rule)
		if until.IsZero() || h.Until.Before(until) {
			until = h.Until
		}
	}
	return names, until
}

// Fired reports whether any rule fired.
func (d *Decision) Fired() bool {
	for _, r := range d.Rules {
		if r.Outcome == OutcomeFired {
			return true
		}
	}
	return false
}

// Explain renders the decision for people, one fact a line.
func (d *Decision) Explain() string {
	var b strings.Builder
	b.Grow(256 + 96*len(d.Rules))
	fmt.Fprintf(&b, "event %s", d.Kind)
	if d.Instance != "" {
		fmt.Fprintf(&b, " instance %s", d.Instance)
	}
	if d.Project != "" {
		fmt.Fprintf(&b, " project %s", d.Project)
	}
	fmt.Fprintf(&b, " at %s (policy %s)\n", d.Time.UTC().Format(time.RFC3339), d.Policy)
	if d.Preferred != "" || d.PreferredWhy != "" {
		p := d.Preferred
		if p == "" {
			p = "none"
		}
		fmt.Fprintf(&b, "preferred profile: %s (%s)\n", p, d.PreferredWhy)
	}
	switch {
	case d.Rejected:
		fmt.Fprintf(&b, "decision: rejected: %s\n", d.Reason)
	case len(d.Intents) == 0:
		b.WriteString("decision: nothing to do\n")
	default:
		fmt.Fprintf(&b, "decision: %d intent(s)\n", len(d.Intents))
	}
	for _, in := range d.Intents {
		b.WriteString("  ")
		b.WriteString(in.summary())
		b.WriteString("\n    why: ")
		b.WriteString(in.Why)
		b.WriteByte('\n')
		for _, x := range in.ExcludedHosts {
			b.WriteString("    excluded host ")
			b.WriteString(x.Host)
			b.WriteString(": ")
			b.WriteString(x.Reason)
			b.WriteByte('\n')
		}
	}
	for _, h := range d.Held {
		fmt.Fprintf(&b, "  held back: rule %s until %s (evaluated again then)\n", h.Rule, h.Until.UTC().Format(time.RFC3339))
	}
	for _, r := range d.Refused {
		b.WriteString("  refused ")
		b.WriteString(r.Intent.summary())
		b.WriteString(": ")
		b.WriteString(r.Reason)
		b.WriteByte('\n')
	}
	b.WriteString("rules:\n")
	for _, t := range d.Rules {
		b.WriteString("  ")
		b.WriteString(string(t.Outcome))
		for i := len(t.Outcome); i < 8; i++ {
			b.WriteByte(' ')
		}
		b.WriteByte(' ')
		b.WriteString(t.Rule)
		b.WriteString(" (")
		b.WriteString(strconv.Itoa(t.Line))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(t.Col))
		b.WriteByte(')')
		for i, v := range t.Values {
			if i == 0 {
				b.WriteString(": ")
			} else {
				b.WriteString(", ")
			}
			b.WriteString(v.Path)
			b.WriteByte('=')
			b.WriteString(v.Value)
		}
		if t.Detail != "" {
			b.WriteString(" — ")
			b.WriteString(t.Detail)
		}
		b.WriteByte('\n')
	}
	if len(d.Rules) == 0 {
		b.WriteString("  no rule listens to this event kind\n")
	}
	if d.OtherRules > 0 {
		fmt.Fprintf(&b, "  %d other rule(s) listen to other event kinds\n", d.OtherRules)
	}
	return b.String()
}

func (in Intent) summary() string {
	var b strings.Builder
	b.Grow(96)
	b.WriteString(string(in.Kind))
	switch in.Kind {
	case IntentAttach:
		b.WriteByte(' ')
		b.WriteString(orNone(in.Profile))
		b.WriteString(" x")
		b.WriteString(strconv.Itoa(in.Count))
	case IntentRelease:
		if in.Profile != "" {
			b.WriteByte(' ')
			b.WriteString(in.Profile)
		}
		if in.Count > 0 {
			b.WriteString(" x")
			b.WriteString(strconv.Itoa(in.Count))
		}
	case IntentResize:
		b.WriteString(" to ")
		b.WriteString(orNone(in.Profile))
	case IntentMove:
		b.WriteString(" off ")
		b.WriteString(orNone(strings.Join(in.GPUs, ",")))
	case IntentTune:
		b.WriteString(" scheduler=")
		b.WriteString(orNone(in.Scheduler))
		b.WriteString(" timeslice_us=")
		b.WriteString(strconv.Itoa(in.TimesliceUS))
		b.WriteString(" clocks_mhz=")
		b.WriteString(strconv.Itoa(in.ClocksMHz))
		if in.Tenant {
			b.WriteString(" by=tenant")
		}
		if len(in.GPUs) > 0 {
			b.WriteString(" gpus=")
			b.WriteString(strings.Join(in.GPUs, ","))
		}
	case IntentSetLimits:
		b.WriteString(" cpu_max=")
		b.WriteString(strconv.Quote(in.CPUMax))
		b.WriteString(" memory_high=")
		b.WriteString(strconv.Quote(in.MemoryHigh))
	case IntentNotify, IntentReject:
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(in.Message))
	}
	if in.Mode != "" {
		b.WriteString(" mode=")
		b.WriteString(string(in.Mode))
	}
	if in.Trait != "" {
		b.WriteString(" trait=")
		b.WriteString(in.Trait)
	}
	if in.FrameRateLimit != nil {
		b.WriteString(" frame_rate_limit=")
		b.WriteString(onOff(*in.FrameRateLimit))
	}
	if in.Rule != "" {
		b.WriteString(" [rule ")
		b.WriteString(in.Rule)
		b.WriteByte(']')
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
