package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Controls are the operators' global switches (bridge/controls.Store).
type Controls interface {
	// Paused is the cheap check before an inbox poll.
	Paused(ctx context.Context, part string) (bool, error)
	// Gate reads the mode in an event's decision transaction, holding it
	// until the transaction ends, and names the event's request id.
	Gate(ctx context.Context, tx pgx.Tx, eventID int64) (controls.Gate, error)
}

var _ Controls = (*controls.Store)(nil)

// paused reports whether operators paused the pipeline; errors count as
// not paused (the gate in each decision's transaction decides again).
func (p *Processor) paused(ctx context.Context, part string) bool {
	return Paused(ctx, p.d.Controls, p.log, part)
}

// Paused reports whether operators paused part of the bridge's work
// (c nil: never); an error reading the controls is logged and counts as
// not paused.
func Paused(ctx context.Context, c Controls, log *slog.Logger, part string) bool {
	if c == nil {
		return false
	}
	held, err := c.Paused(ctx, part)
	if err != nil {
		log.Warn("pipeline: cannot read the operator controls", logkey.Err, err)
		return false
	}
	return held
}

// gate runs the controls' gate for row in tx: paused leaves the event in
// the inbox (false); observe-only is noted on row; the event's request id
// goes into ctx (outgoing OpenStack calls, context logs).
func (p *Processor) gate(ctx context.Context, tx pgx.Tx, row *InboxRow) (context.Context, bool, error) {
	if p.d.Controls == nil {
		return ctx, true, nil
	}
	g, err := p.d.Controls.Gate(ctx, tx, row.ID)
	if err != nil {
		return ctx, false, err
	}
	if g.Paused {
		return ctx, false, nil
	}
	row.observeOnly = g.ObserveOnly
	ctx = requestid.With(ctx, g.GlobalRequestID)
	// Ties the event to its global_request_id in the logs.
	p.log.LogAttrs(ctx, slog.LevelDebug, "pipeline: deciding event", slog.Int64(logkey.Event, row.ID), slog.Bool("observe_only", g.ObserveOnly))
	return ctx, true, nil
}

// observe turns a plan that would act into a rejection explaining what it
// would have done: observe-only mode decides and explains, acts on nothing.
func observe(plan flow.Plan, f Facts) flow.Plan {
	var would []string
	for _, s := range plan.Steps {
		switch s.Kind {
		case flow.StepAttach:
			would = append(would, fmt.Sprintf("attach %d × %s (%s) on host %s", max(s.Intent.Count, 1), s.Intent.Profile, s.Intent.Trait, f.Instance.Host))
		case flow.StepRelease:
			for _, a := range s.Release {
				would = append(would, fmt.Sprintf("release %s (mdev %s) on %s", a.Profile, a.ID, a.Host))
			}
		case flow.StepReattach:
			for _, a := range s.Release {
				would = append(would, fmt.Sprintf("attach %s (mdev %s) again on %s", a.Profile, a.ID, a.Host))
			}
		case flow.StepCommand:
			would = append(would, fmt.Sprintf("%s on %s", s.Command, s.Host))
		case flow.StepNovaResize:
			would = append(would, fmt.Sprintf("resize through Nova to a flavor with %d × %s (%s), on host %s or where Nova's scheduler puts it",
				max(s.Intent.Count, 1), s.Intent.Profile, s.Intent.Trait, s.Host))
		case flow.StepNotify:
		default:
			would = append(would, string(s.Kind))
		}
	}
	if len(would) == 0 {
		would = append(would, "nothing an agent would have been sent")
	}
	plan.Outcome, plan.Code = flow.OutcomeReject, flow.CodeObserveOnly
	plan.Reason = "observe-only mode: would have: " + strings.Join(would, "; ")
	var keep []flow.Step
	for _, s := range plan.Steps {
		if s.Kind == flow.StepNotify {
			keep = append(keep, s)
		}
	}
	plan.Steps = keep
	return plan
}
