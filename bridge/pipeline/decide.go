package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// Claim is a Placement claim made for one event's decision, between its
// two transactions (DirectPath.Claim); it is released if the second does
// not commit. Held is what the consumer holds of Provider's Class after it.
type Claim struct {
	Consumer, Provider, Class string
	Amount, Held              int
}

// errRetry wraps errors after which the event is tried again later.
type errRetry struct{ err error }

func (e errRetry) Error() string { return e.err.Error() }
func (e errRetry) Unwrap() error { return e.err }

// processOne handles one inbox row. It returns false when the row was not
// processed now (another replica holds it or its instance, or an earlier
// event of the same instance is still open).
//
// No Placement call runs inside a transaction, and the policy is
// evaluated once per event: the decision runs in one transaction; when
// its plan needs Placement claims, that transaction commits the claims it
// plans (requests.PlanClaims: they count in the project's usage from then
// on) and stops; the claims are made with no transaction open; a second,
// short transaction records them with their attachments and commands and
// closes the event, carrying out the acts the first one planned
// (Work.pending) without deciding again. The instance's advisory lock
// (decideLocked) keeps other replicas off the instance meanwhile. A crash
// after the first commit leaves the event open with its plan: it is
// decided again (the plan is replaced), and the units a crash left
// claimed but unrecorded are found in the consumer and adopted (DirectPath.Claim),
// so nothing is leaked or doubled.
func (p *Processor) processOne(ctx context.Context, c candidate) (bool, error) {
	start := time.Now()
	outbox, closed, err := p.decideLocked(ctx, c)
	if err != nil {
		p.m.events.WithLabelValues("error").Inc()
		return false, p.retryLater(ctx, c.id, err)
	}
	if closed {
		p.m.decide.Observe(time.Since(start).Seconds())
	}
	if outbox && p.d.OnOutbox != nil {
		p.d.OnOutbox()
	}
	return closed, nil
}

// decideLocked decides event c on one connection. The event's instance
// ("" for none) is locked for the decision: by the decision's transaction
// (lockEvent) when it needs no claim; by a session lock, taken before the
// decision commits its plan and held until the claims it did not take are
// given back, when it does; and from the start when Nova changed the
// instance's allocations, which are read before the decision.
func (p *Processor) decideLocked(ctx context.Context, c candidate) (outbox, closed bool, err error) {
	id, inst := c.id, c.instance
	hs := p.hostView(ctx)
	conn, err := p.d.Pool.Acquire(ctx)
	if err != nil {
		return false, false, fmt.Errorf("event %d: %w", id, err)
	}
	defer conn.Release()
	var release func()    // the instance's session lock, when held
	var lockedInst string // the instance release gives back
	defer func() {
		if release != nil {
			release()
		}
	}()
	sessionLock := func(instance string) (bool, error) {
		if release != nil {
			return true, nil
		}
		r, locked, err := store.TryLock(ctx, conn, "vgpu-instance:"+instance)
		if err != nil || !locked {
			return false, err
		}
		release, lockedInst = r, instance
		return true, nil
	}
	w := &Work{hosts: hs}
	if inst != "" && !strings.HasPrefix(c.source, WebhookSourcePrefix) && allocationEvent(NovaKindPrefix+c.kind) {
		if locked, err := sessionLock(inst); err != nil || !locked {
			return false, false, err // another replica decides for the instance now
		}
		// Nova changed the instance's allocations: read them now, before
		// the decision and outside its transaction (KnowAllocations, the
		// moves), so that it decides on them and later claims are one PUT.
		hl, _, err := p.d.Placement.Holdings(ctx, inst)
		if err != nil {
			return false, false, errRetry{fmt.Errorf("read the vGPU allocations of %s: %w", inst, err)}
		}
		w.holdings = map[string][]placement.Holding{inst: hl}
	}
	eager := false
	var unified *unifiedRead // the project's unified limits, read before the transaction (quota.go)
	if p.d.Limits != nil && strings.HasPrefix(c.source, WebhookSourcePrefix) {
		// A request: its decision reads them; other events only when a
		// rule listens (errNeedLimits below).
		if unified, err = p.facts.readUnifiedOf(ctx, conn, c.project, inst); err != nil {
			return false, false, err
		}
	}
	var planned []flow.Attachment // releases the decision planned (ReleaseFor)
	unknownLock := ""             // an instance whose session lock a failed statement may have taken
	for {
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			ptx := &plannedTx{Tx: tx}
			defer func() { planned = ptx.releases }()
			w.reset(ptx)
			w.quota = &quotaGuard{eager: eager, unified: unified}
			held := ""
			if release != nil {
				held = inst
			}
			var err error
			closed, err = p.decide(ctx, w, id, held)
			switch {
			case w.sessionLocked && release == nil:
				// Taken by the statement that wrote the plan (writePlan).
				release, lockedInst = store.Unlocker(ctx, conn, "vgpu-instance:"+w.Row.InstanceUUID), w.Row.InstanceUUID
			case w.lockUnknown && release == nil:
				// That statement failed: whether it took the lock is not
				// known. Given back once the transaction ended.
				unknownLock = w.Row.InstanceUUID
			}
			if err == nil && len(w.pending) > 0 && w.Row.InstanceUUID != "" && held == "" {
				// Claims next: the instance stays locked until they are
				// recorded or given back (the transaction's lock ends
				// with it).
				if locked, err := sessionLock(w.Row.InstanceUUID); err != nil || !locked {
					return cmp.Or(err, fmt.Errorf("lock instance %s for the claims", w.Row.InstanceUUID))
				}
			}
			return err
		})
		if unknownLock != "" {
			conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, "vgpu-instance:"+unknownLock) //nolint:errcheck
			unknownLock = ""
		}
		if errors.Is(err, errQuotaMoved) && !eager {
			eager = true // again, locking the project's usage before reading it
			p.m.quotaRetries.Inc()
			continue
		}
		if nl := (errLookup{}); errors.As(err, &nl) && w.looked == nil {
			// The request's instance is unknown: Nova is asked for it
			// with no transaction open, and the event decided again.
			if w.looked, err = p.lookUp(ctx, nl); err != nil {
				return false, false, err
			}
			continue
		}
		var need errNeedLimits
		if errors.As(err, &need) && (unified == nil || unified.project != need.project) {
			// The project was known only in the transaction: its limits
			// are read now, with none open, and the decision taken again.
			if unified, err = p.facts.readUnified(ctx, conn, need.project); err != nil {
				return false, false, err
			}
			continue
		}
		break
	}
	if err == nil {
		p.rel.made(ctx, planned) // committed: made with no transaction open
	}
	if err != nil || len(w.pending) == 0 {
		return w.Outbox, closed && err == nil, err
	}

	// The decision committed its plan: claim, with no transaction open,
	// under the event's request id (Placement's logs).
	ctx = requestid.With(ctx, w.requestID)
	failpoint.Hit(FailBeforePlacement)
	if err := p.makeClaims(ctx, w); err != nil {
		return false, false, err
	}
	failpoint.Hit(FailAfterPlacement)
	recorded := false
	w.unlockKey = ""
	if release != nil && lockedInst == w.Row.InstanceUUID {
		w.unlockKey = "vgpu-instance:" + lockedInst
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		ptx := &plannedTx{Tx: tx}
		defer func() { planned = ptx.releases }()
		w.Tx, w.Outbox, w.unused, w.notes, w.unlockTried = ptx, false, nil, nil, false
		var err error
		recorded, err = p.apply(ctx, w)
		return err
	})
	if err == nil {
		p.rel.made(ctx, planned)
	}
	if w.unlockTried {
		// The statement that closed the event gave the session lock
		// back (apply).
		release = nil
		if err != nil {
			// It did not commit, and may have given it back: the
			// session's locks go, and the lock is taken again to give the
			// claims back under it. Should another replica hold it now,
			// it decides the event again and adopts the claims, as after
			// a crash.
			conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock_all()`) //nolint:errcheck
			if locked, lerr := sessionLock(w.Row.InstanceUUID); lerr != nil || !locked {
				p.log.Warn("pipeline: the record of a decision's claims did not commit and its instance is locked by another session: "+
					"the claims are left to the decision that adopts them", logkey.Instance, w.Row.InstanceUUID, logkey.Err, err)
				return false, false, err
			}
		}
	}
	// Still under the instance's lock: no other decision can adopt these
	// units before they are given back.
	if err != nil || !recorded {
		var all []Claim
		for _, pa := range w.pending {
			all = append(all, allClaims(pa.claims)...)
		}
		p.direct.ReleaseClaims(ctx, all, "the record of the decision's claims did not commit")
		return false, false, err
	}
	failpoint.Hit(FailAfterRecord)
	if len(w.unused) > 0 {
		p.direct.ReleaseClaims(ctx, w.unused, "the decision did not take the claim")
	}
	return w.Outbox, true, nil
}

// decide runs the first transaction of event id: it locks the event,
// passes it through the stages and either closes it or, when acts need
// claims (w.pending), commits their plans and leaves the event open. held
// is the instance whose session lock decideLocked holds ("" for none);
// otherwise lockEvent takes the transaction's lock of the event's
// instance. It returns false when the event was not decided now.
func (p *Processor) decide(ctx context.Context, w *Work, id int64, held string) (bool, error) {
	tx := w.Tx
	row, ok, err := lockEvent(ctx, tx, id, held == "")
	if err != nil || !ok {
		return false, err
	}
	ctx, ok, err = p.gate(ctx, tx, &row) // operator pause / observe-only (bridge/controls)
	if err != nil || !ok {
		return false, err
	}
	if row.InstanceUUID != "" {
		// lockEvent read whether an earlier event of the instance is open
		// (row.earlier). When the session lock held is another instance's
		// than the row's, the row's is taken and that read again.
		if held != "" && row.InstanceUUID != held {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('vgpu-instance:' || $1, 0))`, row.InstanceUUID); err != nil {
				return false, fmt.Errorf("lock instance %s: %w", row.InstanceUUID, err)
			}
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM events WHERE instance_uuid = $1 AND id < $2 AND processed_at IS NULL
					AND (deferred_from IS NULL OR not_before IS NULL OR not_before <= now()))`, row.InstanceUUID, row.ID).Scan(&row.earlier); err != nil {
				return false, err
			}
		}
		if row.earlier {
			return false, nil // an earlier event of the instance goes first (lockEvent)
		}
	}
	if row.planned {
		// An earlier attempt planned claims and did not record them:
		// decided again from the start, its plan goes.
		if err := requests.DropPlanned(ctx, tx, row.ID); err != nil {
			return false, err
		}
	}
	w.Row, w.requestID, w.held = row, requestid.From(ctx), held
	w.lastAttempt = row.Attempts+1 >= p.cfg.MaxAttempts
	return true, p.run(ctx, w)
}

// apply is the second transaction of an event whose acts needed claims:
// each act (pendingAct) runs again with the claims made for it, and the
// event is closed. It records nothing (false) when the event was closed
// meanwhile, or the operators paused the bridge or switched observe-only
// mode since the decision (the event is decided again later, its plan
// replaced); an act whose request ended meanwhile (an operator's cancel)
// takes none of its claims.
func (p *Processor) apply(ctx context.Context, w *Work) (bool, error) {
	tx := w.Tx
	// The event and the first act's request are locked and read in one
	// statement (the request's state and last command, as the loop below
	// reads the others'); most events have one act.
	var first *lockedRequest
	if len(w.pending) > 0 {
		first = &lockedRequest{id: w.pending[0].request}
	}
	// With unlockKey, the event's instance is locked by the transaction
	// too (this session holds its session lock: granted at once), so
	// that the statement that closes the event can give the session lock
	// back before the commit.
	row, ok, err := lockEventWith(ctx, tx, w.Row.ID, w.unlockKey != "", first)
	if err != nil || !ok {
		return false, err
	}
	ctx, ok, err = p.gate(ctx, tx, &row) // the decision's mode still holds (bridge/controls)
	if err != nil || !ok || row.observeOnly != w.Row.observeOnly {
		return false, err
	}
	w.Row.Attempts = row.Attempts
	w.lastAttempt = row.Attempts+1 >= p.cfg.MaxAttempts
	w.applying = true
	for i, pa := range w.pending {
		var st string
		if i == 0 {
			if first.state == nil {
				return false, fmt.Errorf("read request %s: %w", pa.request, pgx.ErrNoRows)
			}
			st, w.seq = *first.state, first.seq
		} else if err := tx.QueryRow(ctx, `SELECT state, (SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1) FROM requests WHERE id = $1 FOR UPDATE`,
			pa.request).Scan(&st, &w.seq); err != nil {
			return false, fmt.Errorf("read request %s: %w", pa.request, err)
		}
		w.claims = pa.claims
		if state := requests.State(st); state.Final() {
			w.giveBack = true
		} else if err := p.direct.ActPlan(ctx, w, pa.request, state, &pa.plan, pa.facts); err != nil {
			return false, fmt.Errorf("event %d: record the claims of request %s: %w", row.ID, pa.request, err)
		}
		w.doneWithClaims()
		w.Outbox = true
	}
	unlock := ""
	if len(w.unused) == 0 {
		unlock = w.unlockKey // no claim left to give back under the lock
	}
	w.unlockTried = unlock != ""
	return true, requests.CloseAppliedWith(ctx, tx, row.ID, w.notes, unlock)
}

// Failpoints of a decision that needs Placement claims
// (internal/failpoint): crash tests kill the bridge at each.
const (
	FailBeforePlacement = "pipeline.before_placement" // the plan (or a planned release) committed; no claim (release) made yet
	FailAfterPlacement  = "pipeline.after_placement"  // the claim (or release) is made in Placement, not recorded
	FailAfterRecord     = "pipeline.after_record"     // recorded and committed; outbox not kicked
)

// makeClaims claims, in order, the units of each attach step of each act
// waiting for them, with no transaction open. A step that finds no
// capacity ends its act's claims (apply fails that act there); any other
// error gives back what was claimed and the event is tried again.
func (p *Processor) makeClaims(ctx context.Context, w *Work) error {
	for i := range w.pending {
		pa := &w.pending[i]
		var planned []flow.Attachment
		for _, s := range pa.plan.Steps {
			if s.Kind != flow.StepAttach {
				continue
			}
			made, err := p.direct.Claim(ctx, pa.request, pa.facts, s, planned)
			pa.claims = append(pa.claims, stepClaim{made: made, err: err})
			if err != nil && (errors.Is(err, ErrNoCapacity) || errors.Is(err, ErrNoAddress)) {
				break
			}
			if err != nil {
				for _, pa := range w.pending {
					p.direct.ReleaseClaims(ctx, allClaims(pa.claims), "a claim of the same decision failed")
				}
				return errRetry{fmt.Errorf("claim %d × %s on node %s: %w", max(s.Intent.Count, 1), s.Intent.Profile, pa.facts.Instance.Node, err)}
			}
			for _, mc := range made {
				planned = append(planned, flow.Attachment{Provider: mc.Provider, Amount: mc.Amount})
			}
		}
	}
	return nil
}

// stepClaim is what the claim of one attach step made, or why it failed.
type stepClaim struct {
	made []Claim
	err  error
}

func allClaims(cs []stepClaim) []Claim {
	var out []Claim
	for _, c := range cs {
		out = append(out, c.made...)
	}
	return out
}

// lockEvent reads inbox event id, locked, unless another transaction
// holds it or it is processed (false). With lockInstance, it also takes
// the transaction's advisory lock of the event's instance, and reports
// false when another session holds that.
func lockEvent(ctx context.Context, tx pgx.Tx, id int64, lockInstance bool) (InboxRow, bool, error) {
	return lockEventWith(ctx, tx, id, lockInstance, nil)
}

// lockedRequest is a request lockEventWith locks and reads with the
// event: its state (nil: no such request) and its last command's number.
type lockedRequest struct {
	id    uuid.UUID
	state *string
	seq   int
}

// lockEventWith is lockEvent that, with req, also locks request req.id
// (FOR UPDATE, after the event, as a statement of its own would) and
// reads its state and last command into req, in the same statement. req
// is read only when the event is.
//
// Without req and with lockInstance (the decision's first transaction,
// no session lock held), a webhook event's own request
// (InboxRow.BridgeRequest) is locked and its state read the same way
// once the instance's lock is taken, for ReadRequest: InboxRow.request.
func lockEventWith(ctx context.Context, tx pgx.Tx, id int64, lockInstance bool, req *lockedRequest) (InboxRow, bool, error) {
	var r InboxRow
	var inst, reqID, proj *string
	var occurred, notBefore *time.Time
	var deferredFrom *int64
	var instanceLocked bool
	var reqArg *uuid.UUID
	var reqState *string
	var reqSeq int
	if req != nil {
		reqArg = &req.id
	}
	err := tx.QueryRow(ctx, `SELECT id, source, message_id, event_type, instance_uuid::text, occurred_at, received_at, payload, request_id,
			project_id, attempts, deferred_from, deferred_rules, not_before,
			EXISTS (SELECT 1 FROM planned_claims p WHERE p.event_id = events.id),
			EXISTS (SELECT 1 FROM events e WHERE e.instance_uuid = events.instance_uuid AND e.id < events.id AND e.processed_at IS NULL
				AND (e.deferred_from IS NULL OR e.not_before IS NULL OR e.not_before <= now())),
			l.locked, l.own AND l.locked, CASE
				WHEN $3::uuid IS NOT NULL THEN (SELECT state FROM requests WHERE id = $3::uuid FOR UPDATE)
				WHEN l.own AND l.locked THEN (SELECT state FROM requests WHERE id = events.request_id::uuid FOR UPDATE) END,
			CASE WHEN $3::uuid IS NOT NULL THEN (SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $3::uuid) ELSE 0 END
		FROM events, LATERAL (SELECT NOT $2 OR instance_uuid IS NULL
				OR pg_try_advisory_xact_lock(hashtextextended('vgpu-instance:' || instance_uuid::text, 0)) AS locked,
			$2 AND $3::uuid IS NULL AND left(source, length($4)) = $4
				AND coalesce(request_id ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$', false) AS own OFFSET 0) l
		WHERE id = $1 AND processed_at IS NULL FOR UPDATE OF events SKIP LOCKED`, id, lockInstance, reqArg, WebhookSourcePrefix).
		Scan(&r.ID, &r.Source, &r.MessageID, &r.EventType, &inst, &occurred, &r.ReceivedAt, &r.Payload, &reqID, &proj, &r.Attempts,
			&deferredFrom, &r.DeferredRules, &notBefore, &r.planned, &r.earlier, &instanceLocked, &r.request.read, &reqState, &reqSeq)
	if req != nil {
		req.state, req.seq = reqState, reqSeq
	} else {
		r.request.state = reqState
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("lock event %d: %w", id, err)
	}
	if !instanceLocked {
		return r, false, nil // another replica decides for the instance now
	}
	if inst != nil {
		r.InstanceUUID = *inst
	}
	if reqID != nil {
		r.RequestID = *reqID
	}
	if proj != nil {
		r.ProjectID = *proj
	}
	if occurred != nil {
		r.OccurredAt = *occurred
	}
	if deferredFrom != nil {
		r.DeferredFrom = *deferredFrom
		if notBefore != nil {
			r.NotBefore = *notBefore
		}
	}
	return r, true, nil
}

// retryLater counts a failed attempt and backs the event off; after
// MaxAttempts the event is closed and its request fails.
func (p *Processor) retryLater(ctx context.Context, id int64, cause error) error {
	if ctx.Err() != nil {
		return cause
	}
	attempts, err := requests.EventAttempt(ctx, p.d.Pool, id, cause.Error())
	if err != nil {
		return errors.Join(cause, err)
	}
	if attempts < p.cfg.MaxAttempts {
		wait := backoff.Policy{Min: p.cfg.RetryMin, Max: p.cfg.RetryMax}.Delay(attempts - 1)
		return errors.Join(cause, requests.EventNotBefore(ctx, p.d.Pool, id, wait))
	}
	// Give up: close the event; its request fails with the last error.
	return errors.Join(cause, p.rel.inTx(ctx, p.d.Pool, func(ctx context.Context, tx pgx.Tx) error {
		row, ok, err := lockEvent(ctx, tx, id, false)
		if err != nil || !ok {
			return err
		}
		if err := requests.MarkEventFailed(ctx, tx, id, cause.Error()); err != nil {
			return err
		}
		if reqID, ok := row.BridgeRequest(); ok {
			return p.direct.FailRequest(ctx, tx, reqID, flow.CodeEventFailed,
				fmt.Sprintf("the bridge gave up after %d attempts: %v", attempts, cause))
		}
		return nil
	}))
}
