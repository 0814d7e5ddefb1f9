package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Deferred evaluations.
//
// A rule whose condition holds but whose cooldown or for: window holds it
// back (policy.Decision.Held) is not dropped: the event's decision is
// recorded as usual, and in the same transaction a follow-up row is
// queued in the inbox, a copy of the event due when the earliest hold
// ends (events.not_before), naming the event first held back
// (deferred_from) and the rules held (deferred_rules). When it is due, it
// is evaluated again (policy.EvaluateHeld): the held rules only, against
// the instance's state and load state at that time, with the time of the
// re-evaluation as the policy's now. The latest state wins:
//
//   - A newer event of the same kind about the same instance (the same
//     source and type; for an Alertmanager alert, the same alert: its
//     fingerprint, else its labels) that came after the event first held
//     back supersedes the follow-up: it closes without evaluating
//     (code superseded), since the newer event was evaluated on its own.
//     An alert that resolves inside the cooldown and fires again before
//     its end therefore releases nothing.
//   - Otherwise the held rules decide on what is true then: a release
//     whose vGPU is already gone does nothing, a rule still held is
//     deferred again (to its new end), one that fires acts.
//
// Only the rules held are evaluated again, so a rule that fired with the
// event does not fire twice; the event's own effects (flavor accounting,
// allocations read, a Nova move followed, vGPUs re-attached after a
// rebuild) happened when it was first processed and are not repeated.
//
// The bridge's own bridge.vgpu_load events are not deferred: they come
// again every load_interval while the instance has samples (periodic).
//
// A follow-up is an inbox row of its own: it survives a restart, is
// picked up by any replica, starts with no attempts (a deferral is not a
// failed attempt and never reaches max_attempts), and gets its own
// decision row. While it waits (or backs off after a failed attempt) it
// does not hold back its instance's later events: they are decided in
// order among themselves, and a newer one of the same kind supersedes it,
// so holding them for a whole cooldown would only delay them (a delete,
// an alert firing again). Once due it takes its place in the instance's
// order like any event.
//
// A request whose event is deferred with nothing else decided stays
// accepted, in phase deferred, with the rules held and the time of the
// re-evaluation in its reason; the follow-up carries the request and
// ends it. When other rules of the same event fired, the request ends
// with what they did, and the follow-up, carrying no request, opens one
// of its own if it acts (as for a notification).

// FollowUp reports whether the row is a deferred evaluation (a follow-up
// of an event a cooldown or for: window held back).
func (r InboxRow) FollowUp() bool { return r.DeferredFrom != 0 }

// deferReason says which rules are held and until when.
func deferReason(d *policy.Decision) string {
	_, until := d.HeldRules()
	var parts []string
	for _, h := range d.Held {
		for _, r := range d.Rules {
			if r.Rule == h.Rule {
				parts = append(parts, fmt.Sprintf("rule %s: %s", r.Rule, r.Detail))
				break
			}
		}
	}
	return fmt.Sprintf("deferred until %s, then evaluated again (%s)", until.UTC().Format(time.RFC3339), strings.Join(parts, "; "))
}

// reevaluationStages are the stages a follow-up runs: those that decide
// and record. The others act on the event's own news (accounting, moves,
// resizes, allocations), which its first processing took in.
func reevaluationStages(stages []Stage) []Stage {
	out := make([]Stage, 0, len(stages))
	for _, s := range stages {
		switch s.(type) {
		case ReadRequest, ReadEvent, Evaluate, OpenRequest, Act, Record:
			out = append(out, s)
		}
	}
	return out
}

// deferHeld queues the follow-up of a decision that held rules back. The
// follow-up carries the event's request when the decision deferred the
// whole event (OutcomeDefer), or when the event is a notification (its
// request_id is Nova's); otherwise the request ends with what fired.
func deferHeld(ctx context.Context, w *Work) error {
	rules, until := w.Decision.HeldRules()
	if len(rules) == 0 || periodic(w.Row) {
		return nil
	}
	keep := w.Plan.Outcome == flow.OutcomeDefer || !w.Row.Webhook()
	if err := requests.DeferEvent(ctx, w.Tx, w.Row.ID, keep, until, rules); err != nil {
		return fmt.Errorf("defer event %d until %s: %w", w.Row.ID, until.UTC().Format(time.RFC3339), err)
	}
	return nil
}

// periodic reports whether the row's source sends it again by itself: the
// bridge writes an instance's bridge.vgpu_load every [pipeline]
// load_interval while its window has samples, so a rule it held back is
// evaluated again on fresh samples anyway; and once the samples stop,
// nothing says the condition still holds.
func periodic(row InboxRow) bool {
	return row.Source == BridgeSource && row.EventType == EventVGPULoad
}

// superseded returns the id of a newer event of the same kind about the
// same instance than the event the follow-up row defers (0: none).
func superseded(ctx context.Context, tx pgx.Tx, row InboxRow) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `SELECT x.id FROM events f JOIN events x ON x.instance_uuid = f.instance_uuid
			AND x.id > f.deferred_from AND x.deferred_from IS NULL AND x.source = f.source AND x.event_type = f.event_type
			AND coalesce((x.payload->'alert'->'fingerprint')::jsonb, (x.payload->'alert'->'labels')::jsonb)
				IS NOT DISTINCT FROM coalesce((f.payload->'alert'->'fingerprint')::jsonb, (f.payload->'alert'->'labels')::jsonb)
		WHERE f.id = $1 ORDER BY x.id LIMIT 1`, row.ID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("is event %d superseded: %w", row.ID, err)
	}
	return id, nil
}

// reevaluate prepares a follow-up's evaluation: the policy's now is the
// time of the re-evaluation (never before the hold's end); a superseded
// follow-up gets its decision and plan here, and ok is false.
func reevaluate(ctx context.Context, w *Work, pol *policy.Policy) (ok bool, err error) {
	now := time.Now()
	if now.Before(w.Row.NotBefore) {
		now = w.Row.NotBefore
	}
	if w.Event.Time.Before(now) {
		w.Event.Time = now
	}
	by, err := superseded(ctx, w.Tx, w.Row)
	if err != nil || by == 0 {
		return err == nil, err
	}
	ev := w.Event
	w.Decision = &policy.Decision{Kind: ev.Kind, Instance: ev.InstanceUUID, Project: ev.ProjectID, Time: ev.Time, Policy: pol.Hash(),
		Intents: []policy.Intent{}, Rules: []policy.RuleTrace{}}
	w.Plan = flow.Plan{Outcome: flow.OutcomeNothing, Code: flow.CodeSuperseded,
		Reason: fmt.Sprintf("superseded by event %d, a newer %s about the instance, received before the hold of rule(s) %s ended: the latest state wins",
			by, ev.Kind, strings.Join(w.Row.DeferredRules, ", "))}
	if w.HasRequest {
		w.Plan.Outcome = flow.OutcomeReject
	}
	return false, nil
}

// deferRequest keeps a request whose event is deferred accepted, in phase
// deferred.
func (d Decisions) deferRequest(ctx context.Context, w *Work) error {
	if w.State != requests.Accepted {
		return nil // a sibling event of the request already decided it
	}
	_, err := d.requests.Transition(ctx, w.Tx, w.Request, requests.Accepted, flow.PhaseDeferred, w.Plan.Reason, "")
	return err
}
