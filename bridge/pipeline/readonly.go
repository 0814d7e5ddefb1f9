package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// StateReader reads, without writing or locking anything, what the
// decision about an inbox event is taken on: the policy's event and the
// state the pipeline's Evaluate stage gives the policy (the event's
// instance and its vGPUs, the hosts as their agents last reported them,
// the project's usage). `vgpu-bridge policy replay` (package
// policyreplay) evaluates recorded events with it.
//
// The state is the bridge's now, not as it was when the event came: the
// bridge does not keep its state's history. Keystone's unified limits are
// not read (the policy file's quotas still apply), and an instance the
// bridge does not know is not looked up in Nova.
type StateReader struct {
	facts *factReader
	hosts *hostSet
	skew  time.Duration
}

// NewStateReader reads the hosts' last reports in q once, for every
// event read after. cat may be nil; skew is [pipeline]
// clock_skew_tolerance (0: its default).
func NewStateReader(ctx context.Context, q Querier, cat Catalog, skew time.Duration, log *slog.Logger) (*StateReader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if skew <= 0 {
		skew = DefaultConfig().ClockSkewTolerance
	}
	hs, err := loadHosts(ctx, q, cat)
	if err != nil {
		return nil, err
	}
	return &StateReader{facts: &factReader{catalog: cat, log: log}, hosts: hs, skew: skew}, nil
}

// Event maps an inbox row to the policy's event, timed as the pipeline
// times it (the source's time, bounded by the bridge's receipt).
func (s *StateReader) Event(row InboxRow) (policy.Event, error) {
	ev, err := MapEvent(row)
	if err != nil {
		return ev, err
	}
	ev.Time = eventTime(row, s.skew)
	return ev, nil
}

// State reads the state the policy judges ev on, in tx (which may be
// read only): no lock is taken and nothing is written.
func (s *StateReader) State(ctx context.Context, tx pgx.Tx, ev policy.Event) (policy.State, error) {
	_, st, err := s.facts.loadFacts(ctx, tx, ev, s.hosts, usageRead{lazy: true})
	if err != nil {
		return nil, fmt.Errorf("read the state of event %s: %w", ev.Kind, err)
	}
	return st, nil
}

// EvaluateOnly evaluates ev with p as the Evaluate stage does: the intents a
// bridge event may not have (bridge.vgpu_changed changes no vGPUs) are
// refused the same way. ls may be nil.
func EvaluateOnly(p *policy.Policy, ev policy.Event, st policy.State, ls policy.LoadState) *policy.Decision {
	d := p.Evaluate(ev, st, ls)
	onlyFollowUps(d, ev.Kind)
	return d
}
