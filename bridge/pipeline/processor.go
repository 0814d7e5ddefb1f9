package pipeline

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// PolicySource gives the active policy (policy.Holder).
type PolicySource interface {
	Policy() *policy.Policy
}

// Deps are the processor's collaborators.
type Deps struct {
	// Pool is the pipeline's own pool, of at least Workers+2 connections:
	// a decision's transaction holds one while the placement feature
	// writes its mirror through another pool. Sharing one pool could
	// starve the nested writes; New lowers Workers to fit.
	Pool      *pgxpool.Pool
	Requests  *requests.Store
	Policy    PolicySource
	Placement Placement
	Catalog   Catalog // may be nil
	Log       *slog.Logger
	Registry  prometheus.Registerer // may be nil
	// OnOutbox is called after commands were committed, to wake the
	// relay of this process; nil: the relay polls.
	OnOutbox func()
	// Controls are the operators' pause and observe-only switches; nil:
	// always running.
	Controls Controls
}

// Processor runs the pipeline. It is safe for concurrent use.
type Processor struct {
	cfg   Config
	d     Deps
	log   *slog.Logger
	wake  wake.Waker
	hosts atomic.Pointer[hostSet]
	m     *metrics
	// stages decide about each event, results take agent results of
	// requests other packages run (Use).
	stages  []Stage
	results []ResultTaker
}

// New builds a processor.
func New(cfg Config, d Deps) (*Processor, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Pool == nil || d.Policy == nil || d.Placement == nil {
		return nil, errors.New("pipeline: pool, policy and placement are required")
	}
	if d.Requests == nil {
		d.Requests = requests.NewStore(d.Pool, "vgpu-bridge")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Replica == "" {
		cfg.Replica, _ = os.Hostname()
	}
	if mc := int(d.Pool.Config().MaxConns); cfg.Workers > mc-2 {
		d.Log.Warn("pipeline: fewer workers than configured, to leave the pool room", "workers", max(mc-2, 1), "configured", cfg.Workers, "pool", mc)
		cfg.Workers = max(mc-2, 1)
	}
	p := &Processor{cfg: cfg, d: d, log: d.Log, m: newMetrics(d.Registry), stages: DefaultStages()}
	p.hosts.Store(&hostSet{byName: map[string]int{}})
	return p, nil
}

// Use sets the stages that decide about each inbox event, in order
// (stage.go), and the takers that see each agent result before the
// direct path does (ResultTaker). Call it before Run; without it a
// processor runs DefaultStages.
func (p *Processor) Use(stages []Stage, results ...ResultTaker) {
	p.stages, p.results = stages, results
}

// Wake makes the inbox loop look at the inbox now.
func (p *Processor) Wake() { p.wake.Wake() }

// Run processes the inbox and watches deadlines until ctx ends.
func (p *Processor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(p.cfg.WatchdogInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if p.paused(ctx, "deadlines") {
				continue // paused: no decisions, failing requests included
			}
			if _, err := p.CheckDeadlines(ctx); err != nil && ctx.Err() == nil {
				p.log.Warn("pipeline: deadline check failed", logkey.Err, err)
			}
		}
	}()
	if p.cfg.LoadInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.runLoad(ctx)
		}()
	}
	defer wg.Wait()
	return wake.Loop(ctx, p.wake.C(), func(ctx context.Context) (time.Duration, error) {
		n, err := p.ProcessOnce(ctx)
		if err != nil && ctx.Err() == nil {
			p.log.Warn("pipeline: inbox poll failed", logkey.Err, err)
		}
		if n > 0 {
			return 0, nil // more may be waiting
		}
		return p.cfg.PollInterval, nil
	})
}

// refreshHosts re-reads the agents' reports when the cached view is old.
func (p *Processor) hostView(ctx context.Context) *hostSet {
	hs := p.hosts.Load()
	if time.Since(hs.at) < p.cfg.HostsRefresh {
		return hs
	}
	nh, err := loadHosts(ctx, p.d.Pool, p.d.Catalog)
	if err != nil {
		p.log.Warn("pipeline: cannot read hosts; using the last view", logkey.Err, err)
		return hs
	}
	p.hosts.Store(nh)
	return nh
}

type candidate struct {
	id       int64
	instance string
	project  string // "" for an event of no known project
	source   string
	kind     string // the event's type
}

// inboxBatch reads the inbox's next events, at most $1: the projects that
// have ready events, the one with the oldest first (at most $1 of them),
// and of each its first ready events after id $4[i] (0 when the project
// is not in $3), at most $5[i] (or $2) of them; the first event of each
// project, then the second, and so on. ProcessOnce passes, per project, the last
// event it queued and the room left in the project's share, so a look
// reads only what is new. Events of no known project count as the project
// "". The projects are walked on events_unprocessed_project_idx, one probe
// each, so the cost does not grow with a backlog.
const inboxBatch = `WITH RECURSIVE projects(k) AS (
		(SELECT coalesce(project_id, '') FROM events WHERE processed_at IS NULL ORDER BY coalesce(project_id, '') LIMIT 1)
		UNION ALL
		SELECT (SELECT coalesce(project_id, '') FROM events
			WHERE processed_at IS NULL AND coalesce(project_id, '') > projects.k ORDER BY coalesce(project_id, '') LIMIT 1)
		FROM projects WHERE projects.k IS NOT NULL
	), heads AS (
		SELECT projects.k, h.id AS head FROM projects CROSS JOIN LATERAL (
			SELECT id FROM events WHERE processed_at IS NULL AND coalesce(project_id, '') = projects.k
				AND (not_before IS NULL OR not_before <= now())
			ORDER BY id LIMIT 1) h
		WHERE projects.k IS NOT NULL
		ORDER BY h.id LIMIT $1
	), queued AS (
		SELECT * FROM unnest($3::text[], $4::bigint[], $5::int[]) AS q(k, after, room)
	)
	SELECT heads.k, e.id, e.inst, e.source, e.event_type FROM heads LEFT JOIN queued ON queued.k = heads.k CROSS JOIN LATERAL (
		SELECT id, coalesce(instance_uuid::text, '') AS inst, source, event_type FROM events
		WHERE processed_at IS NULL AND coalesce(project_id, '') = heads.k AND (not_before IS NULL OR not_before <= now())
			AND id > coalesce(queued.after, 0)
		ORDER BY id LIMIT coalesce(queued.room, $2)) e
	ORDER BY row_number() OVER (PARTITION BY heads.k ORDER BY e.id), heads.head
	LIMIT $1`

// minRepoll and maxRepoll bound the least time between two looks at the
// inbox that a wake (a commit) asks for while events are being decided:
// ten times what the last look took, so that a slow look (thousands of
// projects with a backlog) is not run back to back. A look because the
// queue runs low is not held back.
const (
	minRepoll = 5 * time.Millisecond
	maxRepoll = 20 * time.Millisecond
)

// ProcessOnce decides the inbox's events until none is ready; it returns
// how many events it closed. Its workers take the projects' events in
// turns (one of each project with events queued, then the next), events
// of one instance one at a time and in order. It looks at the inbox
// (inboxBatch) again when its queue runs low and, while deciding, when a
// commit wakes it, so that an event of another project joins the turns
// within milliseconds instead of waiting behind a backlog. At most
// ProjectShare events of a project are queued or being decided at a time
// (a full look, once a second, may add the project's older events that
// became ready again), so no more than that many of one project's events
// go ahead of another project's event once a look found it.
func (p *Processor) ProcessOnce(ctx context.Context) (int, error) {
	if p.paused(ctx, "pipeline") {
		return 0, nil // events wait in the inbox until resumed
	}
	s := newTurns(min(p.cfg.ProjectShare, p.cfg.BatchSize))
	took, err := p.poll(ctx, s)
	if err != nil || s.queued == 0 {
		return 0, err
	}
	type outcome struct {
		c   candidate
		ok  bool
		err error
	}
	work := make(chan candidate)
	results := make(chan outcome)
	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Go(func() {
			for c := range work {
				ok, err := p.processOne(ctx, c)
				results <- outcome{c, ok, err}
			}
		})
	}
	defer func() { close(work); wg.Wait() }()
	n, inflight := 0, 0
	lastPoll := time.Now()
	woken := false
	for {
		for inflight < p.cfg.Workers && ctx.Err() == nil {
			c, ok := s.next()
			if !ok {
				break
			}
			inflight++
			work <- c
		}
		if inflight == 0 {
			if ctx.Err() != nil {
				return n, nil
			}
			if took, err = p.poll(ctx, s); err != nil || s.queued == 0 {
				return n, err
			}
			lastPoll, woken = time.Now(), false
			continue
		}
		gap := min(max(minRepoll, 10*took), maxRepoll)
		var again <-chan time.Time
		var t *time.Timer
		if woken {
			t = time.NewTimer(time.Until(lastPoll.Add(gap)))
			again = t.C
		}
		select {
		case o := <-results:
			inflight--
			s.finished(o.c, o.ok && o.err == nil)
			switch {
			case o.err != nil:
				p.log.Warn("pipeline: event not processed", logkey.Event, o.c.id, logkey.Err, o.err)
				s.drop(o.c.instance) // keep the instance's order: the rest waits
			case !o.ok:
				s.drop(o.c.instance)
			default:
				n++
			}
		case <-p.wake.C():
			woken = true
		case <-again:
		}
		if t != nil {
			t.Stop()
		}
		low := s.queued < p.cfg.Workers
		if ctx.Err() == nil && (low || woken && time.Since(lastPoll) >= gap) {
			if took, err = p.poll(ctx, s); err != nil {
				p.log.Warn("pipeline: inbox poll failed", logkey.Err, err)
			}
			lastPoll, woken = time.Now(), false
		}
	}
}

// poll queues the inbox's next events (inboxBatch) and returns how long
// the look took.
func (p *Processor) poll(ctx context.Context, s *turns) (time.Duration, error) {
	start := time.Now()
	// Now and then a look from each project's first event: events before
	// the last one queued that became ready since (a retry's backoff
	// ended) are not left for the next call, which a steady stream of
	// events may hold off for long;
	full := time.Since(s.lastFull) >= fullLook
	if full {
		// and the events given up on may be taken again.
		s.lastFull = start
		for id := range s.dropped {
			delete(s.seen, id)
		}
		clear(s.dropped)
	}
	var ks []string
	var after []int64
	var room []int32
	for k, st := range s.projects {
		last, r := st.last, max(s.share-st.held, 0)
		if full {
			last, r = 0, s.share // the project's first share of events, queued ones included
		}
		ks, after, room = append(ks, k), append(after, last), append(room, int32(r))
	}
	rows, err := p.d.Pool.Query(ctx, inboxBatch, p.cfg.BatchSize, s.share, ks, after, room)
	if err != nil {
		return time.Since(start), fmt.Errorf("poll inbox: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.project, &c.id, &c.instance, &c.source, &c.kind); err != nil {
			return time.Since(start), err
		}
		s.add(c)
	}
	return time.Since(start), rows.Err()
}

// turns is what ProcessOnce has queued, by project: the projects take
// turns, each giving its oldest queued event whose instance is not being
// decided.
type turns struct {
	share    int
	order    []string // projects with events queued, in turn order
	queues   map[string][]candidate
	turn     int                      // index in order of the project whose turn is next
	projects map[string]*projectState // every project met in this call
	seen     map[int64]bool           // queued, being decided, or given up on in this call
	dropped  map[int64]bool           // given up on since the last full look
	busy     map[string]bool          // instances being decided
	queued   int
	lastFull time.Time // the last look from each project's first event
}

// fullLook is how often a look starts from each project's first ready
// event rather than after the last one queued.
const fullLook = time.Second

type projectState struct {
	last int64 // the last event queued
	held int   // events queued or being decided
}

func newTurns(share int) *turns {
	return &turns{share: share, queues: map[string][]candidate{}, projects: map[string]*projectState{},
		seen: map[int64]bool{}, dropped: map[int64]bool{}, busy: map[string]bool{}, lastFull: time.Now()}
}

func (s *turns) add(c candidate) {
	if s.seen[c.id] {
		return
	}
	s.seen[c.id] = true
	st := s.projects[c.project]
	if st == nil {
		st = &projectState{}
		s.projects[c.project] = st
	}
	st.last, st.held = max(st.last, c.id), st.held+1
	if _, ok := s.queues[c.project]; !ok {
		s.order = append(s.order, c.project)
	}
	s.queues[c.project] = append(s.queues[c.project], c)
	s.queued++
}

// next takes the next event to decide, or false when every queued event's
// instance is being decided (or none is queued).
func (s *turns) next() (candidate, bool) {
	for range len(s.order) {
		if s.turn >= len(s.order) {
			s.turn = 0
		}
		proj := s.order[s.turn]
		q := s.queues[proj]
		for i, c := range q {
			if c.instance != "" && s.busy[c.instance] {
				continue
			}
			if c.instance != "" {
				s.busy[c.instance] = true
			}
			s.queues[proj] = append(q[:i:i], q[i+1:]...)
			s.queued--
			if len(s.queues[proj]) == 0 {
				s.remove(s.turn)
			} else {
				s.turn++
			}
			return c, true
		}
		s.turn++
	}
	return candidate{}, false
}

// remove takes the project at i out of the turns.
func (s *turns) remove(i int) {
	delete(s.queues, s.order[i])
	s.order = slices.Delete(s.order, i, i+1)
}

// finished records that c is no longer being decided; closed: it was,
// else it is given up on until the next full look.
func (s *turns) finished(c candidate, closed bool) {
	delete(s.busy, c.instance)
	s.projects[c.project].held--
	if closed {
		delete(s.seen, c.id) // no look returns it again
	} else {
		s.dropped[c.id] = true
	}
}

// drop gives up on the queued events of instance until the next full
// look: an earlier one was not decided, and its later ones wait.
func (s *turns) drop(instance string) {
	if instance == "" {
		return
	}
	for i := 0; i < len(s.order); {
		proj := s.order[i]
		q := slices.DeleteFunc(s.queues[proj], func(c candidate) bool {
			if c.instance == instance {
				s.dropped[c.id] = true
				return true
			}
			return false
		})
		gone := len(s.queues[proj]) - len(q)
		s.queued -= gone
		s.projects[proj].held -= gone
		s.queues[proj] = q
		if len(q) == 0 {
			s.remove(i)
			if s.turn > i {
				s.turn--
			}
			continue
		}
		i++
	}
}

// madeClaim is a Placement claim made for one event's decision, between
// its two transactions; it is released if the second does not commit.
type madeClaim struct {
	consumer, provider, class string
	amount, held              int
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
// closes the event, going on from the stage that planned (Work.resumeAt)
// with what the first one decided. A session advisory lock on the
// instance, held on the same connection throughout, keeps other replicas
// off the instance meanwhile. A crash after the first commit leaves the
// event open with its plan: it is decided again (the plan is replaced),
// and the units a crash left claimed but unrecorded are found in the
// consumer and adopted (claim), so nothing is leaked or doubled.
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
	var release func() // the instance's session lock, when held
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
		release = r
		return true, nil
	}
	w := &Work{p: p, hosts: hs}
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
	for {
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			w.reset(tx)
			gctx := context.WithValue(ctx, quotaGuardKey{}, &quotaGuard{p: p, eager: eager})
			held := ""
			if release != nil {
				held = inst
			}
			var err error
			closed, err = p.decide(gctx, w, id, held)
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
		if errors.Is(err, errQuotaMoved) && !eager {
			eager = true // again, locking the project's usage before reading it
			p.m.quotaRetries.Inc()
			continue
		}
		break
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
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		w.Tx, w.Outbox, w.unused = tx, false, nil
		var err error
		recorded, err = p.apply(ctx, w)
		return err
	})
	// Still under the instance's lock: no other decision can adopt these
	// units before they are given back.
	if err != nil || !recorded {
		var all []madeClaim
		for _, pa := range w.pending {
			all = append(all, allClaims(pa.claims)...)
		}
		p.releaseClaims(ctx, all, "the record of the decision's claims did not commit")
		return false, false, err
	}
	failpoint.Hit(FailAfterRecord)
	if len(w.unused) > 0 {
		p.releaseClaims(ctx, w.unused, "the decision did not take the claim")
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
	w.Row, w.requestID = row, requestid.From(ctx)
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
	row, ok, err := lockEvent(ctx, tx, w.Row.ID, false)
	if err != nil || !ok {
		return false, err
	}
	ctx, ok, err = p.gate(ctx, tx, &row) // the decision's mode still holds (bridge/controls)
	if err != nil || !ok || row.observeOnly != w.Row.observeOnly {
		return false, err
	}
	w.Row.Attempts = row.Attempts
	w.applying = true
	for _, pa := range w.pending {
		var st string
		if err := tx.QueryRow(ctx, `SELECT state FROM requests WHERE id = $1 FOR UPDATE`, pa.request).Scan(&st); err != nil {
			return false, fmt.Errorf("read request %s: %w", pa.request, err)
		}
		w.claims = pa.claims
		if state := requests.State(st); state.Final() {
			w.giveBack = true
		} else if err := p.act(ctx, w, pa.request, state, &pa.plan, pa.facts); err != nil {
			return false, fmt.Errorf("event %d: record the claims of request %s: %w", row.ID, pa.request, err)
		}
		w.doneWithClaims()
		w.Outbox = true
	}
	return true, requests.CloseApplied(ctx, tx, row.ID)
}

// Failpoints of a decision that needs Placement claims
// (internal/failpoint): crash tests kill the bridge at each.
const (
	FailBeforePlacement = "pipeline.before_placement" // the plan committed; no claim made yet (also: a round stopped for a release)
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
			made, err := p.claim(ctx, pa.facts, s, planned)
			pa.claims = append(pa.claims, stepClaim{made: made, err: err})
			if err != nil && (errors.Is(err, ErrNoCapacity) || errors.Is(err, errNoAddress)) {
				break
			}
			if err != nil {
				for _, pa := range w.pending {
					p.releaseClaims(ctx, allClaims(pa.claims), "a claim of the same decision failed")
				}
				return errRetry{fmt.Errorf("claim %d × %s on node %s: %w", max(s.Intent.Count, 1), s.Intent.Profile, pa.facts.Instance.Node, err)}
			}
			for _, mc := range made {
				planned = append(planned, flow.Attachment{Provider: mc.provider, Amount: mc.amount})
			}
		}
	}
	return nil
}

// stepClaim is what the claim of one attach step made, or why it failed.
type stepClaim struct {
	made []madeClaim
	err  error
}

func allClaims(cs []stepClaim) []madeClaim {
	var out []madeClaim
	for _, c := range cs {
		out = append(out, c.made...)
	}
	return out
}

// errNeedClaims stops a transaction that needs a Placement release it has
// not made yet (rounds makes it, then runs the transaction again).
var errNeedClaims = errors.New("the transaction needs Placement calls made first")

// maxClaimRounds bounds the rounds of one transaction that releases.
const maxClaimRounds = 8

// txBeginner is a pool or a connection.
type txBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// rounds runs fn in a transaction of db until it no longer stops for a
// Placement release (errNeedClaims): between two rounds, with no
// transaction open, it makes the releases the last round asked for
// (releaseFor). Decisions do not run in rounds (decideLocked); an agent's
// result, a deadline and a Nova-path step that give units back do.
func (p *Processor) rounds(ctx context.Context, db txBeginner, fn func(ctx context.Context, tx pgx.Tx) error) error {
	pc, _ := ctx.Value(preclaimsKey{}).(*preclaims)
	if pc == nil {
		pc = &preclaims{}
		ctx = context.WithValue(ctx, preclaimsKey{}, pc)
	}
	for round := 1; ; round++ {
		pc.needRelease = nil
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return fn(ctx, tx) })
		if errors.Is(err, errQuotaMoved) && !pc.quotaEager && round < maxClaimRounds {
			pc.quotaEager = true // again, locking the project's usage before reading it
			p.m.quotaRetries.Inc()
			continue
		}
		if !errors.Is(err, errNeedClaims) || round >= maxClaimRounds {
			return err
		}
		failpoint.Hit(FailBeforePlacement)
		for _, a := range pc.needRelease { // no transaction is open here
			if err := p.d.Placement.ReleaseUnits(ctx, a.InstanceUUID, a.Provider, a.Class, a.Amount, a.HeldAfter); err != nil {
				return errRetry{fmt.Errorf("release attachment %s (%d %s on %s): %w", a.ID, a.Amount, a.Class, a.Provider, err)}
			}
			if pc.released == nil {
				pc.released = map[uuid.UUID]bool{}
			}
			pc.released[a.ID] = true
		}
		failpoint.Hit(FailAfterPlacement)
	}
}

// releaseFor gives back attachment a's claim in Placement: a release made
// before this round counts as done; else it is recorded as needed and
// errNeedClaims stops the round.
func (p *Processor) releaseFor(ctx context.Context, a flow.Attachment) error {
	pc := preclaimsIn(ctx)
	if pc.released[a.ID] {
		return nil
	}
	pc.needRelease = append(pc.needRelease, a)
	return errNeedClaims
}

// preclaims are the releases made for one transaction between its
// rounds.
type preclaims struct {
	needRelease []flow.Attachment  // releases the last round stopped for
	released    map[uuid.UUID]bool // attachments whose claim was given back
	// quotaEager: a round found its project's usage moved between its
	// read and its lock (errQuotaMoved); the next ones lock first.
	quotaEager bool
}

type preclaimsKey struct{}

// preclaimsIn returns the preclaims of the rounds ctx runs in. A Placement
// release is only ever asked for inside rounds: anything else is a bug.
func preclaimsIn(ctx context.Context) *preclaims {
	pc, _ := ctx.Value(preclaimsKey{}).(*preclaims)
	if pc == nil {
		panic("pipeline: a Placement release asked for outside rounds")
	}
	return pc
}

// lockEvent reads inbox event id, locked, unless another transaction
// holds it or it is processed (false). With lockInstance, it also takes
// the transaction's advisory lock of the event's instance, and reports
// false when another session holds that.
func lockEvent(ctx context.Context, tx pgx.Tx, id int64, lockInstance bool) (InboxRow, bool, error) {
	var r InboxRow
	var inst, reqID, proj *string
	var occurred, notBefore *time.Time
	var deferredFrom *int64
	var instanceLocked bool
	err := tx.QueryRow(ctx, `SELECT id, source, message_id, event_type, instance_uuid::text, occurred_at, received_at, payload, request_id,
			project_id, attempts, deferred_from, deferred_rules, not_before,
			EXISTS (SELECT 1 FROM planned_claims p WHERE p.event_id = events.id),
			EXISTS (SELECT 1 FROM events e WHERE e.instance_uuid = events.instance_uuid AND e.id < events.id AND e.processed_at IS NULL
				AND (e.deferred_from IS NULL OR e.not_before IS NULL OR e.not_before <= now())),
			NOT $2 OR instance_uuid IS NULL OR pg_try_advisory_xact_lock(hashtextextended('vgpu-instance:' || instance_uuid::text, 0))
		FROM events WHERE id = $1 AND processed_at IS NULL FOR UPDATE SKIP LOCKED`, id, lockInstance).
		Scan(&r.ID, &r.Source, &r.MessageID, &r.EventType, &inst, &occurred, &r.ReceivedAt, &r.Payload, &reqID, &proj, &r.Attempts,
			&deferredFrom, &r.DeferredRules, &notBefore, &r.planned, &r.earlier, &instanceLocked)
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
	return errors.Join(cause, p.rounds(ctx, p.d.Pool, func(ctx context.Context, tx pgx.Tx) error {
		row, ok, err := lockEvent(ctx, tx, id, false)
		if err != nil || !ok {
			return err
		}
		if err := requests.MarkEventFailed(ctx, tx, id, cause.Error()); err != nil {
			return err
		}
		if reqID, ok := row.BridgeRequest(); ok {
			return p.failRequest(ctx, tx, reqID, flow.CodeEventFailed,
				fmt.Sprintf("the bridge gave up after %d attempts: %v", attempts, cause), nil)
		}
		return nil
	}))
}

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
			if err := LockQuota(ctx, tx); err != nil {
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
	var seq int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1`, reqID).Scan(&seq); err != nil {
		return err
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
	if err := requests.AddAttachments(ctx, tx, reqID, atts); err != nil {
		return err
	}
	for _, a := range release {
		if err := requests.BeginRelease(ctx, tx, a.ID, reqID); err != nil {
			return err
		}
	}
	if err := insertCommands(ctx, tx, reqID, PurposeAction, cmds); err != nil {
		return err
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
	if err := requests.SetDeadline(ctx, tx, reqID, deadline); err != nil {
		return err
	}
	reason := joinNonEmpty("; ", summary...)
	if _, err := p.d.Requests.Transition(ctx, tx, reqID, nextState(state, requests.Decided), "queued", reason, ""); err != nil {
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
	rows := make([]requests.Command, len(cmds))
	for i, oc := range cmds {
		body, err := json.Marshal(oc.c)
		if err != nil {
			return fmt.Errorf("request %s: encode command %s: %w", reqID, oc.c.Kind, err)
		}
		rows[i] = requests.Command{ID: oc.c.ID, Host: oc.c.Host, Kind: string(oc.c.Kind), Body: body, ExpiresAt: oc.c.ExpiresAt,
			Seq: oc.seq, AttachmentID: oc.attachment, InstanceUUID: oc.c.InstanceUUID}
	}
	return requests.QueueCommands(ctx, tx, reqID, purpose, rows)
}
