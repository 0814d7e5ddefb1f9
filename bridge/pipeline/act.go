package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// closeWithout ends a request whose decision does nothing: rejected, or
// failed when the bridge cannot act. A request with several events (an
// Alertmanager group) waits for its last one.
func (p *Processor) closeWithout(ctx context.Context, tx pgx.Tx, row InboxRow, reqID uuid.UUID, state requests.State, plan flow.Plan) error {
	if state != requests.Accepted {
		return nil // a sibling event already decided it
	}
	var others bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM events WHERE request_id = $1 AND id <> $2 AND processed_at IS NULL)`,
		reqID.String(), row.ID).Scan(&others); err != nil {
		return err
	}
	if others {
		return nil
	}
	to := requests.Rejected
	if plan.Outcome == flow.OutcomeFail {
		to = requests.Failed
	}
	_, err := p.d.Requests.Transition(ctx, tx, reqID, to, "", plan.Reason, plan.Code)
	return err
}

func (p *Processor) recordDecision(ctx context.Context, tx pgx.Tx, row InboxRow, reqID *uuid.UUID, d *policy.Decision, plan flow.Plan) error {
	doc, err := json.Marshal(struct {
		*policy.Decision
		Plan struct {
			Outcome flow.Outcome `json:"outcome"`
			Code    string       `json:"code,omitempty"`
			Reason  string       `json:"reason,omitempty"`
			Notes   []string     `json:"notes,omitempty"`
		} `json:"plan"`
		Explanation string `json:"explanation"`
	}{Decision: d, Plan: struct {
		Outcome flow.Outcome `json:"outcome"`
		Code    string       `json:"code,omitempty"`
		Reason  string       `json:"reason,omitempty"`
		Notes   []string     `json:"notes,omitempty"`
	}{plan.Outcome, plan.Code, plan.Reason, plan.Notes}, Explanation: d.Explain()})
	if err != nil {
		return err
	}
	var inst *string
	if _, err := uuid.Parse(row.InstanceUUID); err == nil {
		inst = &row.InstanceUUID
	}
	return requests.RecordDecision(ctx, tx, requests.Decision{EventID: row.ID, RequestID: reqID, InstanceUUID: inst,
		Policy: d.Policy, Rejected: plan.Outcome == flow.OutcomeReject, Reason: plan.Reason, Doc: doc, Replica: p.cfg.Replica})
}

// act runs an OutcomeAct plan: claims, attachment rows, commands and the
// request's transition to decided. A claim that cannot be made turns the
// plan into a failure (plan.Outcome is set to OutcomeFail) after the claims
// already made are released.
//
// In the decision's transaction, a plan that attaches is only planned: its
// vGPUs are committed as planned claims (requests.PlanClaims, after
// LockQuota) and the act waits in w.pending; decideLocked claims, and act
// runs again in the second transaction (apply) with the claims made.
func (p *Processor) act(ctx context.Context, w *Work, reqID uuid.UUID, state requests.State, plan *flow.Plan, f Facts) error {
	tx, row := w.Tx, w.Row
	if !w.applying {
		var planned []requests.PlannedClaim
		for _, s := range plan.Steps {
			if s.Kind == flow.StepAttach {
				planned = append(planned, requests.PlannedClaim{Profile: s.Intent.Profile, Units: max(s.Intent.Count, 1)})
			}
		}
		if len(planned) > 0 {
			// New vGPUs add to the project's usage: lock it now, and stop
			// if it moved since the decision read it.
			if err := w.LockQuota(ctx); err != nil {
				return err
			}
			if err := requests.PlanClaims(ctx, tx, row.ID, reqID, f.Instance.UUID, planned); err != nil {
				return err
			}
			w.pending = append(w.pending, pendingAct{request: reqID, plan: clonePlan(*plan), facts: f})
			return nil
		}
	}
	now := time.Now()
	deadline := now.Add(p.cfg.RequestTimeout)
	seq := w.seq // read with the request's state (apply)
	if !w.applying {
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1`, reqID).Scan(&seq); err != nil {
			return err
		}
	}
	var claims []madeClaim
	var cmds []outCmd
	var atts []flow.Attachment
	var release []flow.Attachment
	var summary []string
	for _, s := range plan.Steps {
		switch s.Kind {
		case flow.StepAttach:
			made, err := w.nextClaim()
			claims = append(claims, made...)
			if err != nil {
				if errors.Is(err, ErrNoCapacity) || errors.Is(err, errNoAddress) {
					code := flow.CodeNoCapacity
					if errors.Is(err, errNoAddress) {
						code = flow.CodePlacement
					}
					reason := fmt.Sprintf("no GPU of host %s (node %s) can take %d × %s (%s): %v", f.Instance.Host, f.Instance.Node,
						max(s.Intent.Count, 1), s.Intent.Profile, s.Intent.Trait, err)
					w.giveBack = true // released after the transaction
					if err := p.auditReleased(ctx, tx, reqID, claims, reason); err != nil {
						return err
					}
					plan.Outcome, plan.Code, plan.Reason, plan.Steps = flow.OutcomeFail, code, reason, nil
					return p.closeWithout(ctx, tx, row, reqID, state, *plan)
				}
				return errRetry{fmt.Errorf("claim %d × %s on node %s: %w", max(s.Intent.Count, 1), s.Intent.Profile, f.Instance.Node, err)}
			}
			for _, mc := range made {
				a := flow.Attachment{ID: uuid.New(), InstanceUUID: f.Instance.UUID, RequestID: reqID, Host: f.Instance.Host, Node: f.Instance.Node,
					Provider: mc.provider, Class: mc.class, Amount: 1, HeldAfter: mc.held, PCIAddress: p.d.Placement.GPUAddress(mc.provider),
					TypeID: s.Intent.TypeID, Profile: s.Intent.Profile, Trait: s.Intent.Trait, Mode: s.Mode, State: flow.AttPending,
					FrameRateLimit: s.Intent.FrameRateLimit}
				for u := 0; u < mc.amount; u++ {
					b := a
					if u > 0 {
						b.ID = uuid.New()
					}
					b.HeldAfter = mc.held - (mc.amount - 1 - u)
					cs, err := AttachCommands(b, reqID.String(), now, deadline)
					if err != nil {
						return err
					}
					atts = append(atts, b)
					for _, c := range cs {
						seq++
						cmds = append(cmds, outCmd{c: c, seq: seq, attachment: &b.ID})
					}
				}
				frl := ""
				if s.Intent.FrameRateLimit != nil {
					frl = ", frame-rate limiter " + map[bool]string{true: "on", false: "off"}[*s.Intent.FrameRateLimit]
				}
				summary = append(summary, fmt.Sprintf("attach %d × %s on %s GPU %s%s", mc.amount, s.Intent.Profile, f.Instance.Host, a.PCIAddress, frl))
			}
		case flow.StepRelease:
			for _, a := range s.Release {
				cs, err := ReleaseCommands(a, s.RemoveOnly, reqID.String(), now, deadline)
				if err != nil {
					return err
				}
				release = append(release, a)
				id := a.ID
				for _, c := range cs {
					seq++
					cmds = append(cmds, outCmd{c: c, seq: seq, attachment: &id})
				}
				summary = append(summary, fmt.Sprintf("release %s (mdev %s) on %s", a.Profile, a.ID, a.Host))
			}
		case flow.StepReattach:
			for _, a := range s.Release {
				c, err := NewCommand(protocol.AttachVGPU, a.Host, reqID.String(), a.InstanceUUID,
					protocol.AttachParams{MdevUUID: a.ID.String(), ParentPCI: a.PCIAddress, TypeID: a.TypeID, Mode: agentMode(policy.ModeDirectLive, f.Instance.VMState),
						FrameRateLimit: a.FrameRateLimit},
					now, deadline)
				if err != nil {
					return err
				}
				id := a.ID
				seq++
				cmds = append(cmds, outCmd{c: c, seq: seq, attachment: &id})
				summary = append(summary, fmt.Sprintf("attach %s (mdev %s) again after Nova rebuilt the domain", a.Profile, a.ID))
			}
		case flow.StepCommand:
			c, err := NewCommand(s.Command, s.Host, reqID.String(), f.Instance.UUID, s.Params, now, deadline)
			if err != nil {
				plan.Notes = append(plan.Notes, fmt.Sprintf("%s: %v", s.Command, err))
				continue
			}
			seq++
			cmds = append(cmds, outCmd{c: c, seq: seq})
			summary = append(summary, string(s.Command))
		case flow.StepNotify:
			if err := p.notify(ctx, tx, reqID, f.Instance.UUID, []flow.Step{s}); err != nil {
				return err
			}
		}
	}
	// New vGPUs were in the project's usage as planned since the first
	// transaction: the record takes their place (apply drops the plan).
	// The releases begin first: the attachments and commands go in one
	// statement.
	for _, a := range release {
		if err := requests.BeginRelease(ctx, tx, a.ID, reqID); err != nil {
			return err
		}
	}
	if len(atts) > 0 && len(cmds) > 0 {
		rows, err := commandRows(reqID, cmds)
		if err != nil {
			return err
		}
		if err := requests.RecordAct(ctx, tx, reqID, atts, PurposeAction, rows); err != nil {
			return err
		}
	} else {
		if err := requests.AddAttachments(ctx, tx, reqID, atts); err != nil {
			return err
		}
		if err := insertCommands(ctx, tx, reqID, PurposeAction, cmds); err != nil {
			return err
		}
	}
	if len(cmds) == 0 {
		// Only notes and notifications: nothing for the agents.
		plan.Outcome, plan.Code = flow.OutcomeReject, flow.CodeNoAction
		if plan.Reason == "" {
			plan.Reason = joinNonEmpty("; ", plan.Notes...)
		}
		if plan.Reason == "" {
			plan.Reason = "nothing to send to an agent"
		}
		return p.closeWithout(ctx, tx, row, reqID, state, *plan)
	}
	reason := joinNonEmpty("; ", summary...)
	if _, err := p.d.Requests.TransitionUntil(ctx, tx, reqID, nextState(state, requests.Decided), "queued", reason, "", deadline); err != nil {
		return err
	}
	p.m.claims.Add(float64(len(atts)))
	return nil
}

func rebuildKind(kind string) bool {
	for _, k := range RebuildEvents {
		if kind == NovaKindPrefix+k {
			return true
		}
	}
	return false
}

// notify records the plan's notify steps in the audit log.
func (p *Processor) notify(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, instance string, steps []flow.Step) error {
	for _, s := range steps {
		if s.Kind != flow.StepNotify {
			continue
		}
		detail, _ := json.Marshal(map[string]any{"message": s.Intent.Message, "rule": s.Intent.Rule, "why": s.Intent.Why})
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "notify", ObjectType: "instance",
			ObjectID: orDefault(instance, "-"), RequestID: reqID.String(), Detail: detail}); err != nil {
			return err
		}
	}
	return nil
}

// nextState is to, unless the request is already past it (a sibling event
// of the same request moved it on): then it stays where it is.
func nextState(cur, to requests.State) requests.State {
	if cur == requests.Dispatched && to == requests.Decided {
		return requests.Dispatched
	}
	return to
}

var errNoAddress = errors.New("the GPU provider's name carries no PCI address (<node>_pci_DDDD_BB_SS_F)")

// claim claims the units of an attach step, or adopts units an
// interrupted earlier attempt claimed for this consumer but recorded
// nowhere.
func (p *Processor) claim(ctx context.Context, f Facts, s flow.Step, planned []flow.Attachment) ([]madeClaim, error) {
	n := max(s.Intent.Count, 1)
	known := map[string]int{}
	for _, a := range f.Attachments {
		if a.State != flow.AttFailed && a.State != flow.AttReleased {
			known[a.Provider] += a.Amount
		}
	}
	for _, a := range planned {
		known[a.Provider] += a.Amount
	}
	// What the bridge last read or wrote of the consumer: read when a
	// Nova notification said its allocations changed (KnowAllocations), so
	// a claim is one PUT. Units an interrupted attempt left are found
	// here too: a failed round releases its claims (and records that), a
	// crash empties what the process knew.
	holdings, read, err := p.d.Placement.CachedHoldings(ctx, f.Instance.UUID)
	if err != nil {
		return nil, err
	}
	if f.Instance.FlavorVGPUs == 0 { // a flavor's units are Nova's, never adopted
		for _, h := range holdings {
			if h.Trait != s.Intent.Trait {
				continue
			}
			if excess := h.Amount - known[h.Provider]; excess >= n {
				if p.d.Placement.GPUAddress(h.Provider) == "" {
					continue
				}
				p.log.Info("pipeline: adopting a claim an interrupted attempt made", logkey.Instance, f.Instance.UUID, "provider", h.Provider, "units", n)
				return []madeClaim{{consumer: f.Instance.UUID, provider: h.Provider, class: h.Class, amount: n, held: h.Amount}}, nil
			}
		}
	}
	cl, err := p.d.Placement.Claim(ctx, ClaimSpec{Consumer: f.Instance.UUID, ProjectID: f.Instance.ProjectID, UserID: f.Instance.UserID,
		Node: f.Instance.Node, Trait: s.Intent.Trait, Count: n, Read: read})
	if err != nil {
		return nil, err
	}
	mc := madeClaim{consumer: f.Instance.UUID, provider: cl.Provider, class: cl.Class, amount: cl.Amount, held: cl.Held}
	if p.d.Placement.GPUAddress(cl.Provider) == "" {
		return []madeClaim{mc}, fmt.Errorf("%w: provider %s", errNoAddress, cl.Provider)
	}
	return []madeClaim{mc}, nil
}

// releaseClaims gives back claims made for a decision that did not
// happen; errors are logged (the drift reconciler finds what is left).
func (p *Processor) releaseClaims(ctx context.Context, claims []madeClaim, why string) {
	ctx = context.WithoutCancel(ctx)
	for _, c := range claims {
		if err := p.d.Placement.ReleaseUnits(ctx, c.consumer, c.provider, c.class, c.amount, c.held); err != nil {
			p.log.Error("pipeline: cannot release a claim; Placement keeps it until the reconciler repairs it",
				logkey.Instance, c.consumer, "provider", c.provider, logkey.Err, err, logkey.Reason, why)
			continue
		}
		p.m.compensations.WithLabelValues("claim_released").Inc()
	}
}

func (p *Processor) auditReleased(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, claims []madeClaim, why string) error {
	for _, c := range claims {
		detail, _ := json.Marshal(map[string]any{"claim_released": map[string]any{"provider": c.provider, "class": c.class, "amount": c.amount},
			"reason": why})
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "compensate", ObjectType: "instance",
			ObjectID: c.consumer, RequestID: reqID.String(), Detail: detail}); err != nil {
			return err
		}
	}
	return nil
}

func (p *Processor) actor() string { return "vgpu-bridge/" + p.cfg.Replica }

// Purposes of commands.
const (
	PurposeAction       = requests.PurposeAction
	PurposeCompensation = requests.PurposeCompensation
)

type outCmd struct {
	c          protocol.Command
	seq        int
	attachment *uuid.UUID
}

func insertCommands(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, purpose string, cmds []outCmd) error {
	rows, err := commandRows(reqID, cmds)
	if err != nil {
		return err
	}
	return requests.QueueCommands(ctx, tx, reqID, purpose, rows)
}

// commandRows are cmds as the outbox keeps them.
func commandRows(reqID uuid.UUID, cmds []outCmd) ([]requests.Command, error) {
	rows := make([]requests.Command, len(cmds))
	for i, oc := range cmds {
		body, err := json.Marshal(oc.c)
		if err != nil {
			return nil, fmt.Errorf("request %s: encode command %s: %w", reqID, oc.c.Kind, err)
		}
		rows[i] = requests.Command{ID: oc.c.ID, Host: oc.c.Host, Kind: string(oc.c.Kind), Body: body, ExpiresAt: oc.c.ExpiresAt,
			Seq: oc.seq, AttachmentID: oc.attachment, InstanceUUID: oc.c.InstanceUUID}
	}
	return rows, nil
}
