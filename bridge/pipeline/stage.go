package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/policystate"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Stage is one step of deciding about an inbox event, inside the event's
// transaction. A stage that finishes the event returns true and the
// stages after it do not run; the event is then marked processed (unless
// a stage closed it otherwise). An error rolls the whole transaction back
// and the event is tried again later.
type Stage interface {
	Exec(ctx context.Context, w *Work) (done bool, err error)
}

// StageFunc is a function that is a Stage.
type StageFunc func(ctx context.Context, w *Work) (bool, error)

// Exec implements Stage.
func (f StageFunc) Exec(ctx context.Context, w *Work) (bool, error) { return f(ctx, w) }

// Stages runs its stages in order until one finishes the event.
type Stages []Stage

// Exec implements Stage.
func (ss Stages) Exec(ctx context.Context, w *Work) (bool, error) {
	for _, s := range ss {
		if done, err := s.Exec(ctx, w); err != nil || done {
			return done, err
		}
	}
	return true, nil
}

// Actor carries out a plan's step of a kind the pipeline hands to another
// package (the Nova-native resize), in the decision's transaction. It
// either records what it will do and moves the request to decided, or
// ends the request with Decisions.Fail.
type Actor interface {
	Act(ctx context.Context, w *Work, s flow.Step) error
}

// DirectPath carries out plans on the direct path (package direct):
// claims in Placement, attachments and agent commands. The pipeline
// hands it the plans of its decisions (Act) and, in a decision's second transaction, those
// that waited for their claims (apply); the claims themselves, made
// between the two transactions (makeClaims), and their release when the
// second does not take them; and the failure of requests (Failer).
type DirectPath interface {
	Failer
	// ActPlan carries out plan, an OutcomeAct plan of request reqID (in
	// state) with facts f, in w's transaction: it records the claims,
	// attachments and commands and moves the request to decided; or, in
	// the decision's first transaction, commits a plan that attaches as
	// planned claims (Work.WaitForClaims). A plan it cannot carry out
	// becomes a failure or rejection (plan.Outcome) and closes the request
	// (Decisions.Close).
	ActPlan(ctx context.Context, w *Work, reqID uuid.UUID, state requests.State, plan *flow.Plan, f Facts) error
	// Claim claims the units of attach step s of request reqID, with no
	// transaction open; planned are the units the same act claimed before
	// it. ErrNoCapacity and ErrNoAddress fail the act; other errors retry
	// the event.
	Claim(ctx context.Context, reqID uuid.UUID, f Facts, s flow.Step, planned []flow.Attachment) ([]Claim, error)
	// ReleaseClaims gives back claims made for a decision that did not
	// take them; what it cannot give back is logged (the drift reconciler
	// finds it).
	ReleaseClaims(ctx context.Context, claims []Claim, why string)
}

// DefaultStages are the stages of the direct path alone, d (tests,
// benchmarks: direct.Wire), each with its dependencies from l; follow is
// the path's stage that makes vGPUs follow their instance (moves, host
// maintenance). The bridge lists its own where it wires the pipeline
// (setupPipeline).
func DefaultStages(l Lent, d DirectPath, follow Stage) []Stage {
	return []Stage{
		AccountFlavor{Catalog: l.Deps.Catalog, ClockSkew: l.Config.ClockSkewTolerance, NovaVFAliases: l.Config.NovaVFAliases},
		KnowAllocations{Allocations: l.Deps.Placement},
		ReadRequest{Count: l.Counters},
		ReadEvent{ClockSkew: l.Config.ClockSkewTolerance, Fail: d},
		follow,
		Evaluate{Policy: l.Deps.Policy, Decisions: l.Decisions, Count: l.Counters, LooksUp: l.Deps.Lookup != nil},
		OpenRequest{Requests: l.Deps.Requests},
		Act{Direct: d, Decisions: l.Decisions},
		Record{Decisions: l.Decisions, Count: l.Counters},
	}
}

// Work is one event on its way through the stages: its state only; what
// the stages work with they hold themselves (Decisions, Counters, …).
type Work struct {
	Tx  pgx.Tx
	Row InboxRow

	// Request is the bridge request the event belongs to, once known
	// (HasRequest), and State its state as read.
	Request    uuid.UUID
	HasRequest bool
	State      requests.State

	Event    policy.Event
	Decision *policy.Decision
	Plan     flow.Plan
	Facts    Facts

	// Outbox is set by a stage that queued commands for the agents.
	Outbox bool

	hosts  *hostSet
	snap   *snapshot
	closed bool // marked processed (or failed) by a stage already
	// lastAttempt: the event is on its last attempt ([pipeline]
	// max_attempts; LastAttempt).
	lastAttempt bool

	// quota is the decision's view of its project's vGPU usage (nil
	// outside a decision): see quota.go and LockQuota.
	quota *quotaGuard

	// holdings are the vGPU units of the event's instance in Placement,
	// read before the decision when Nova changed its allocations
	// (decideLocked): the decision takes them as they were then.
	holdings map[string][]placement.Holding
	// looked is what Nova answered when the decision found the request's
	// instance unknown and asked for it (decideLocked, lookup.go); nil
	// before.
	looked *lookedUp
	// requestID is the event's global request id, which the claims and
	// the second transaction are made under.
	requestID string
	// pending are the acts whose plans need claims: the decision's
	// transaction commits them as planned claims, and the second
	// transaction carries them out with the claims made between the two
	// (applying, claims: the current act's, consumed in order).
	pending  []pendingAct
	applying bool
	claims   []stepClaim
	used     int
	seq      int     // the current act's request's last command (apply reads it with the request's state)
	giveBack bool    // the current act took none of its claims (it failed for want of capacity)
	unused   []Claim // claims the acts did not take, given back after the commit

	// planned are the claims PlanClaims planned, not yet written
	// (writePlan); planWritten: writePlan ran.
	planned     []plannedWrite
	planWritten bool
	// held is the instance whose session lock decideLocked held when the
	// decision began ("" for none); sessionLocked: writePlan took the
	// event's instance's, lockUnknown: writePlan failed and may have.
	held          string
	sessionLocked bool
	lockUnknown   bool
	// notes are the notifications of the second transaction's act,
	// queued when it closes the event (NotesLater, apply); unlockKey is
	// the session lock decideLocked holds of the event's instance, which
	// that statement gives back when no claim is left to give back
	// (unlockTried: it ran with it).
	notes       []notify.Item
	unlockKey   string
	unlockTried bool
}

// NotesLater is where an act of the second transaction (apply) leaves
// the notifications of its request's transition, which the statement
// that closes the event queues; nil when they are queued at once (more
// than one act: each queues its own, in order).
func (w *Work) NotesLater() *[]notify.Item {
	if !w.applying || len(w.pending) != 1 {
		return nil
	}
	return &w.notes
}

// pendingAct is an act (DirectPath.ActPlan) that waits for its claims.
type pendingAct struct {
	request uuid.UUID
	plan    flow.Plan
	facts   Facts
	claims  []stepClaim
}

// reset makes w the start of a decision in tx.
func (w *Work) reset(tx pgx.Tx) {
	*w = Work{Tx: tx, hosts: w.hosts, holdings: w.holdings, looked: w.looked}
}

// Applying reports whether w is the second transaction of a decision,
// carrying out the acts that waited for their claims (apply).
func (w *Work) Applying() bool { return w.applying }

// WaitForClaims makes plan, for request reqID with facts f, wait for the
// claims of its attach steps: they are made after the decision's
// transaction commits, and ActPlan runs again with them in the second
// (apply).
func (w *Work) WaitForClaims(reqID uuid.UUID, plan flow.Plan, f Facts) {
	w.pending = append(w.pending, pendingAct{request: reqID, plan: clonePlan(plan), facts: f})
}

// LastSeq is the last command's number of the request being applied, read
// with its state (apply); outside apply, 0.
func (w *Work) LastSeq() int { return w.seq }

// GiveBackClaims gives back, after the transaction, every claim made for
// the current act: it failed for want of capacity.
func (w *Work) GiveBackClaims() { w.giveBack = true }

// NextClaim is the claim made for the current act's next attach step.
func (w *Work) NextClaim() ([]Claim, error) {
	if w.used >= len(w.claims) {
		return nil, errors.New("an attach step without a claim made for it")
	}
	c := w.claims[w.used]
	w.used++
	return c.made, c.err
}

// doneWithClaims notes the claims the current act did not take.
func (w *Work) doneWithClaims() {
	if w.giveBack {
		w.unused = append(w.unused, allClaims(w.claims)...)
	} else {
		w.unused = append(w.unused, allClaims(w.claims[min(w.used, len(w.claims)):])...)
	}
	w.claims, w.used, w.giveBack = nil, 0, false
}

// HeldBy returns the units consumer holds in Placement as read before the
// decision.
func (w *Work) HeldBy(consumer string) ([]placement.Holding, error) {
	hl, ok := w.holdings[consumer]
	if !ok {
		return nil, fmt.Errorf("the allocations of %s were not read before the decision", consumer)
	}
	return hl, nil
}

// LastAttempt reports whether the event is on its last attempt: a stage
// that would wait (Retry) should go on instead.
func (w *Work) LastAttempt() bool { return w.lastAttempt }

// Retry wraps err so that the event is tried again later (with backoff)
// instead of counting as a failure of the stage's code.
func Retry(err error) error { return errRetry{err} }

// ReadRequest reads the state of the bridge request a webhook event
// belongs to, locked; an event whose request ended (cancelled before the
// pipeline got to it) is done.
type ReadRequest struct {
	Count Counters // events skipped
}

// Exec implements Stage.
func (r ReadRequest) Exec(ctx context.Context, w *Work) (bool, error) {
	id, ok := w.Row.BridgeRequest()
	if !ok {
		return false, nil
	}
	var st string
	var err error
	switch own := w.Row.request; {
	case own.read && own.state == nil:
		err = pgx.ErrNoRows
	case own.read:
		st = *own.state // locked and read with the row (lockEventWith)
	default:
		err = w.Tx.QueryRow(ctx, `SELECT state FROM requests WHERE id = $1 FOR UPDATE`, id).Scan(&st)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read request %s: %w", id, err)
	}
	w.Request, w.HasRequest, w.State = id, true, requests.State(st)
	if w.State.Final() && w.Row.FollowUp() {
		// A deferred evaluation whose request a sibling event ended goes
		// on without it; one whose request was cancelled ends here.
		var code string
		if err := w.Tx.QueryRow(ctx, `SELECT coalesce(code,'') FROM requests WHERE id = $1`, id).Scan(&code); err != nil {
			return false, fmt.Errorf("read request %s: %w", id, err)
		}
		if code != flow.CodeCancelled {
			w.Request, w.HasRequest, w.State = uuid.Nil, false, ""
			return false, nil
		}
	}
	if w.State.Final() {
		r.Count.Skipped()
		return true, nil
	}
	return false, nil
}

// ReadEvent maps the inbox row to the policy's event. A row that does not
// map closes as failed, and so does its request. The event's time, the
// policy's clock for it (cooldowns, windows), is bounded by the bridge's
// receipt (eventTime).
type ReadEvent struct {
	// ClockSkew is [pipeline] clock_skew_tolerance (eventTime).
	ClockSkew time.Duration
	// Fail fails the request of a row that does not map (the direct
	// path: it undoes what the request did).
	Fail Failer
}

// Exec implements Stage.
func (r ReadEvent) Exec(ctx context.Context, w *Work) (bool, error) {
	ev, err := MapEvent(w.Row)
	if err == nil {
		ev.Time = eventTime(w.Row, r.ClockSkew)
		w.Event = ev
		return false, nil
	}
	if w.HasRequest {
		if err := r.Fail.FailRequest(ctx, w.Tx, w.Request, flow.CodeEventFailed, err.Error()); err != nil {
			return false, err
		}
	}
	w.closed = true
	return true, requests.MarkEventFailed(ctx, w.Tx, w.Row.ID, err.Error())
}

// Evaluate runs the policy on the event with the facts it needs and plans
// the decision. A notification nobody asked about ends here unless the
// plan acts: its decision is recorded only when a rule listened.
type Evaluate struct {
	Policy    PolicySource
	Decisions Decisions
	Count     Counters // events by outcome
	// LooksUp: Nova is asked for a server a request names that the
	// bridge does not know (Deps.Lookup is set; lookup.go).
	LooksUp bool
}

// Exec implements Stage.
func (e Evaluate) Exec(ctx context.Context, w *Work) (bool, error) {
	pol := e.Policy.Policy()
	if w.Row.FollowUp() {
		ok, err := reevaluate(ctx, w, pol)
		if err != nil {
			return false, err
		}
		if !ok { // superseded: a request ends in Act, rejected
			if w.HasRequest {
				return false, nil
			}
			e.Count.Decided(w.Plan.Outcome)
			return true, e.Decisions.recordDecision(ctx, w.Tx, w.Row, nil, w.Decision, w.Plan)
		}
	}
	ev := w.Event
	evaluate := pol.Evaluate
	if w.Row.FollowUp() {
		evaluate = func(ev policy.Event, st policy.State, ls policy.LoadState) *policy.Decision {
			return pol.EvaluateHeld(ev, st, ls, w.Row.DeferredRules)
		}
	}
	if !w.HasRequest && !rebuildKind(ev.Kind) && ev.Kind != NovaKindPrefix+"instance.delete.end" {
		// Most notifications: no rule listens, nothing to re-apply.
		if !pol.Listens(ev.Kind) {
			e.Count.Decided(flow.OutcomeNothing)
			return true, nil
		}
	}
	// The project's usage is read without its lock: the decision takes
	// the lock only if it adds to it (LockQuota).
	facts, st, err := e.Decisions.facts.loadFacts(ctx, w.Tx, ev, w.hosts, w.quota.lazily())
	if err != nil {
		return false, fmt.Errorf("load facts: %w", err)
	}
	var ls *policy.Tracker
	if st != nil && st.loadState != nil {
		ls = st.loadState // read with the facts
	} else if ls, err = policystate.Snapshot(ctx, w.Tx, ev.InstanceUUID); err != nil {
		return false, fmt.Errorf("load policy state: %w", err)
	}
	if w.Row.FollowUp() {
		facts.Rebuilt = false // re-attached when the event came
	}
	if err := w.needLookup(&facts, st, e.LooksUp); err != nil {
		return false, err // asked outside the transaction, then decided again
	}
	w.Facts, w.snap = facts, st
	w.Decision = evaluate(ev, st, ls)
	onlyFollowUps(w.Decision, ev.Kind)
	reqID := ""
	if w.HasRequest {
		reqID = w.Request.String()
	}
	if err := refuseSharedTuning(ctx, w.Tx, w.Decision, e.Decisions.actor(), reqID); err != nil {
		return false, err
	}
	w.Plan = PlanDecision(w.Decision, facts)
	if w.Plan.Outcome == flow.OutcomeDefer && periodic(w.Row) {
		// Evaluated again with the next one (defer.go).
		w.Plan = flow.Plan{Outcome: flow.OutcomeNothing, Code: flow.CodeNoAction, Reason: nothingReason(w.Decision)}
	}
	if w.Row.observeOnly && w.Plan.Outcome == flow.OutcomeAct {
		w.Plan = observe(w.Plan, facts) // decide and explain, act on nothing
	}
	if w.HasRequest || w.Plan.Outcome == flow.OutcomeAct {
		return false, nil
	}
	e.Count.Decided(w.Plan.Outcome)
	if len(w.Decision.Rules) == 0 {
		return true, nil
	}
	if err := e.Decisions.recordDecision(ctx, w.Tx, w.Row, nil, w.Decision, w.Plan); err != nil {
		return false, err
	}
	// A decision that only notifies (e.g. a tenant told of a GPU fault)
	// delivers it with no request: audit, vgpu.policy.notify.
	for _, s := range w.Plan.Steps {
		if s.Kind != flow.StepNotify {
			continue
		}
		if err := requests.DeliverPolicyMessage(ctx, w.Tx, requests.PolicyMessage{Kind: w.Row.EventType, Source: w.Row.Source,
			Instance: w.Facts.Instance.UUID, Rule: s.Intent.Rule, Message: s.Intent.Message, Why: s.Intent.Why, Actor: e.Decisions.actor()}); err != nil {
			return false, fmt.Errorf("notify: %w", err)
		}
	}
	if err := policystate.Apply(ctx, w.Tx, w.Decision.LoadUpdates); err != nil {
		return false, fmt.Errorf("apply policy state: %w", err)
	}
	return true, deferHeld(ctx, w)
}

// OpenRequest makes a request for an event that acts without one (a
// notification a rule acts on).
type OpenRequest struct {
	Requests *requests.Store
}

// Exec implements Stage.
func (o OpenRequest) Exec(ctx context.Context, w *Work) (bool, error) {
	if w.HasRequest {
		return false, nil
	}
	id := uuid.New()
	var inst *uuid.UUID
	if u, err := uuid.Parse(w.Event.InstanceUUID); err == nil {
		inst = &u
	}
	body, _ := json.Marshal(map[string]any{"event_id": w.Row.ID, "event_type": w.Row.EventType, "message_id": w.Row.MessageID})
	if err := o.Requests.Create(ctx, w.Tx, requests.Request{ID: id, Source: w.Row.Source, Kind: w.Row.EventType, InstanceUUID: inst, Body: body}); err != nil {
		return false, fmt.Errorf("create request %s: %w", id, err)
	}
	w.Request, w.HasRequest, w.State = id, true, requests.Accepted
	return false, nil
}

// Act hands the plan to the path that owns its steps: a plan with a Nova
// resize step to NovaResize, the others to Direct (a plan that attaches
// is committed as planned claims and waits for them, the event's second
// transaction records the claims, attachments and commands; other plans
// write their commands at once). A plan that does not act closes its
// request (rejected, or failed).
type Act struct {
	// Direct runs the plans of the direct path (package direct).
	Direct DirectPath
	// NovaResize runs plans with a Nova resize step; nil: they fail with
	// code nova_path_unavailable (Nova's API is not configured).
	NovaResize Actor
	// Decisions defer, notify and close the requests of plans that do
	// not act.
	Decisions Decisions
}

// Exec implements Stage.
func (a Act) Exec(ctx context.Context, w *Work) (bool, error) {
	if w.Plan.Outcome == flow.OutcomeDefer {
		if err := a.Decisions.deferRequest(ctx, w); err != nil {
			return false, fmt.Errorf("request %s: defer: %w", w.Request, err)
		}
		return false, nil
	}
	if w.Plan.Outcome != flow.OutcomeAct {
		if err := a.Decisions.Notify(ctx, w, w.Plan.Steps); err != nil {
			return false, fmt.Errorf("request %s: notify: %w", w.Request, err)
		}
		if err := a.Decisions.closeWithout(ctx, w.Tx, w.Row, w.Request, w.State, w.Plan); err != nil {
			return false, fmt.Errorf("request %s: close %s: %w", w.Request, w.Plan.Outcome, err)
		}
		return false, nil
	}
	var err error
	if s, ok := novaStep(w.Plan.Steps); ok {
		if a.NovaResize == nil {
			err = a.Decisions.Fail(ctx, w, flow.CodeNovaPath, fmt.Sprintf("attach mode %s (the Nova-native path) needs Nova's API: set [nova] endpoint_override and token_file, "+
				"or [openstack] cloud; or set attach_mode: direct-live or direct-cold for this project or profile in the policy", orDefault(string(s.Intent.Mode), "nova-resize")))
		} else {
			err = a.NovaResize.Act(ctx, w, s)
		}
	} else if a.Direct == nil {
		err = errors.New("no direct path to act (pipeline.Act.Direct)")
	} else {
		err = a.Direct.ActPlan(ctx, w, w.Request, w.State, &w.Plan, w.Facts)
	}
	if err != nil {
		return false, fmt.Errorf("decide request %s: %w", w.Request, err)
	}
	w.Outbox = w.Outbox || w.Plan.Outcome == flow.OutcomeAct
	return false, nil
}

// Record records the decision with the plan's outcome and applies the
// policy's load-state updates.
type Record struct {
	Decisions Decisions
	Count     Counters // events by outcome
}

// Exec implements Stage.
func (r Record) Exec(ctx context.Context, w *Work) (bool, error) {
	r.Count.Decided(w.Plan.Outcome)
	id := w.Request
	if len(w.planned) > 0 && policystate.Distinct(w.Decision.LoadUpdates) {
		// The plan waits for its claims: it is written with the
		// decision and the policy's state in one statement.
		d, err := r.Decisions.decisionRecord(w.Row, &id, w.Decision, w.Plan)
		if err != nil {
			return false, err
		}
		ps, err := policystate.ApplyParts(w.Decision.LoadUpdates)
		if err != nil {
			return false, fmt.Errorf("request %s: apply policy state: %w", w.Request, err)
		}
		if err := r.Decisions.writePlan(ctx, w, append([]store.Part{requests.RecordDecisionPart(d)}, ps...)...); err != nil {
			return false, err
		}
		return true, deferHeld(ctx, w)
	}
	if err := r.Decisions.recordDecision(ctx, w.Tx, w.Row, &id, w.Decision, w.Plan); err != nil {
		return false, err
	}
	if err := policystate.Apply(ctx, w.Tx, w.Decision.LoadUpdates); err != nil {
		return false, fmt.Errorf("request %s: apply policy state: %w", w.Request, err)
	}
	return true, deferHeld(ctx, w)
}

// run passes one locked event through the stages and marks it
// processed, unless acts wait for their claims (Work.pending): the
// transaction that records them closes it.
func (p *Processor) run(ctx context.Context, w *Work) error {
	stages := p.stages
	if w.Row.FollowUp() {
		stages = reevaluationStages(stages)
	}
	if _, err := Stages(stages).Exec(ctx, w); err != nil {
		return fmt.Errorf("event %d: %w", w.Row.ID, err)
	}
	if len(w.planned) > 0 || (len(w.pending) > 0 && !w.planWritten) {
		// Planned claims no Record stage wrote (writePlan).
		if err := p.dec.writePlan(ctx, w); err != nil {
			return fmt.Errorf("event %d: %w", w.Row.ID, err)
		}
	}
	if w.closed || len(w.pending) > 0 {
		return nil
	}
	return requests.MarkProcessed(ctx, w.Tx, w.Row.ID)
}

// clonePlan copies p's steps, which the act that waits for its claims
// keeps while the caller may change p.
func clonePlan(p flow.Plan) flow.Plan {
	p.Steps, p.Notes = slices.Clone(p.Steps), slices.Clone(p.Notes)
	return p
}
