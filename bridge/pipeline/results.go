package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// ResultTaker takes agent results: the Nova-native resize those of its
// verify_vgpu, the direct path (package direct) all the others. A taker
// runs in HandleResult's transaction after the command is recorded
// finished, and reports whether it took the result (the takers after it
// do not see it then).
type ResultTaker interface {
	TakeResult(ctx context.Context, tx pgx.Tx, r *AgentResult) (taken bool, err error)
}

// AgentResult is an agent's result as HandleResult recorded it, and what
// the taker asks for once the transaction committed.
type AgentResult struct {
	Result protocol.Result
	// Command is the command it answers, recorded finished; its Request
	// is set.
	Command requests.FinishedCommand
	// Outbox: the taker queued commands (the relay is woken). Changed:
	// it wrote an event the pipeline is to decide (the inbox loop is).
	Outbox, Changed bool
}

// HandleResult records an agent's result and hands it to the first
// taker that takes it (Paths.Results), which moves its request on.
// Duplicate and unknown results are ignored.
func (p *Processor) HandleResult(ctx context.Context, r protocol.Result) (err error) {
	defer wrapErr(&err, "result of command %s", r.CommandID)
	var ar AgentResult
	err = p.rel.inTx(ctx, p.d.Pool, func(ctx context.Context, tx pgx.Tx) error {
		ar = AgentResult{Result: r}
		body, _ := json.Marshal(r)
		// The request of an action command is read (locked) with it for
		// the direct path (Command.View): not for the Nova path's
		// verify_vgpu, whose taker reads what it needs.
		c, ok, err := requests.FinishCommandOnceView(ctx, tx, r.CommandID, r.Host, string(r.Status), body, resultNoView)
		if err != nil {
			return fmt.Errorf("result of %s: %w", r.CommandID, err)
		}
		if !ok {
			p.unrecorded(ctx, tx, r)
			return nil
		}
		p.m.results.WithLabelValues(c.Kind, string(r.Status)).Inc()
		if c.Request == nil {
			return nil
		}
		ar.Command = c
		for _, rt := range p.results {
			if taken, err := rt.TakeResult(ctx, tx, &ar); err != nil || taken {
				return err
			}
		}
		p.log.Warn("pipeline: no path took a result", logkey.Command, r.CommandID, logkey.RequestID, *c.Request, "kind", c.Kind)
		return nil
	})
	if err == nil && ar.Outbox && p.d.OnOutbox != nil {
		p.d.OnOutbox()
	}
	if err == nil && ar.Changed {
		p.Wake() // its bridge.vgpu_changed event, committed
	}
	return err
}

// resultNoView are the kinds of action commands whose request
// HandleResult does not read with the result (the Nova path's).
var resultNoView = []string{string(protocol.VerifyVGPU)}

// unrecorded says why result r recorded nothing: its command is unknown,
// or answered already (a duplicate delivery), or another host's.
func (p *Processor) unrecorded(ctx context.Context, tx pgx.Tx, r protocol.Result) {
	var host string
	var finished bool
	err := tx.QueryRow(ctx, `SELECT host, finished_at IS NOT NULL FROM commands WHERE id::text = $1`, r.CommandID).Scan(&host, &finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		p.log.Debug("pipeline: result of an unknown command", logkey.Command, r.CommandID, logkey.Host, r.Host)
	case err != nil, finished: // a duplicate delivery
	default:
		p.log.Warn("pipeline: result from another host than the command's; ignored", logkey.Command, r.CommandID, logkey.Host, r.Host, "want", host)
	}
}

// DescribeResult says what an agent answered to a command, for a
// request's reason.
func DescribeResult(host, kind string, r protocol.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "agent of host %s: %s %s", host, kind, r.Status)
	if r.Code != "" {
		fmt.Fprintf(&b, " (%s", r.Code)
		if r.NvidiaCode != 0 {
			fmt.Fprintf(&b, ", NVIDIA code %d", r.NvidiaCode)
		}
		b.WriteString(")")
	}
	if r.Message != "" {
		b.WriteString(": " + r.Message)
	}
	if r.Remediation != "" {
		b.WriteString("; remediation: " + r.Remediation)
	}
	return b.String()
}

// wrapErr prefixes *errp, when set, with what failed and its ids; the
// cause stays reachable (errors.Is, errors.As).
func wrapErr(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf(format+": %w", append(args, *errp)...)
	}
}

// Failer fails a request with code and reason and undoes what it began
// (package direct: its vGPUs' claims and mdevs). It runs in a
// transaction of the pipeline (InTx, HandleResult's, a decision's): the
// claims it gives back are planned there (ReleaseFor) and made once it
// committed; the request reads failed once they are (Finish).
type Failer interface {
	FailRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string) error
}

// InTx runs fn in a transaction of the pipeline's pool, as the pipeline
// runs its own: the claims FailRequest and ReleaseFor give back in it are
// recorded there and made in Placement once it committed, never inside
// the transaction; a request Finish ends in it ends after them, in a
// second short transaction.
func (p *Processor) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return p.rel.inTx(ctx, p.d.Pool, fn)
}

// SucceedRequest ends a request that another package ran (a resize
// through Nova) as succeeded with reason.
func (p *Processor) SucceedRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, reason string) error {
	if _, err := p.d.Requests.Transition(ctx, tx, reqID, requests.Succeeded, "", reason, ""); err != nil {
		return fmt.Errorf("request %s succeeded: %w", reqID, err)
	}
	p.m.requests.WithLabelValues(string(requests.Succeeded)).Inc()
	return nil
}

// QueueAction queues command c as the next action of request reqID.
func QueueAction(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, c protocol.Command) error {
	var seq int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1`, reqID).Scan(&seq); err != nil {
		return fmt.Errorf("request %s: next command: %w", reqID, err)
	}
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("request %s: encode command %s: %w", reqID, c.Kind, err)
	}
	return requests.QueueCommands(ctx, tx, reqID, PurposeAction, []requests.Command{{ID: c.ID, Host: c.Host, Kind: string(c.Kind), Body: body,
		ExpiresAt: c.ExpiresAt, Seq: seq + 1, InstanceUUID: c.InstanceUUID}})
}
