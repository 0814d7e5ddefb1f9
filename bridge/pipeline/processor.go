package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
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
	// Lookup asks Nova for a server a request names that the bridge does
	// not know (ingest.Lookup); nil: such a request is rejected
	// unknown_instance at once (Nova is not configured).
	Lookup InstanceLookup
	// Limits are Keystone's unified limits of the projects ([quota]
	// driver = unified_limits, quota.go); nil: the policy file's quotas
	// only.
	Limits LimitSource
}

// InstanceLookup looks up one server in Nova's API and stores it in the
// instances as a listing of Nova's servers would (ingest.Lookup.LookUp):
// true when Nova has it (in project, when not ""), false when Nova says it
// has none (or it is another project's); an error when Nova could not be
// asked. It is called with no transaction open.
type InstanceLookup interface {
	LookUp(ctx context.Context, instance, project string) (bool, error)
}

// Processor runs the pipeline. It is safe for concurrent use.
type Processor struct {
	cfg   Config
	d     Deps
	log   *slog.Logger
	wake  wake.Waker
	hosts atomic.Pointer[hostSet]
	m     *metrics
	// stages decide about each event, results take each agent result,
	// direct carries out the direct path's plans and fails requests (Use).
	stages  []Stage
	results []ResultTaker
	direct  DirectPath
	rel     releaser // the Placement releases its transactions plan
	facts   *factReader
	dec     Decisions // lent to the stages (Lend)
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
	p := &Processor{cfg: cfg, d: d, log: d.Log, m: newMetrics(d.Registry), rel: releaser{pl: d.Placement, pool: d.Pool, store: d.Requests, log: d.Log}}
	p.facts = &factReader{staleAge: cfg.StaleReportAge, catalog: d.Catalog, limits: d.Limits, log: d.Log,
		aliases: cfg.NovaVFAliases}
	p.dec = Decisions{facts: p.facts, requests: d.Requests, replica: cfg.Replica}
	p.hosts.Store(&hostSet{byName: map[string]int{}})
	return p, nil
}

// Paths are what the pipeline hands its work to: the stages that decide
// about each inbox event, in order (stage.go); the takers of agent
// results, in order, the first that takes one ends its way
// (ResultTaker); and the direct path, which carries out the plans of the
// pipeline's own making (the second transaction of a decision that
// claimed) and fails requests (DirectPath). Package direct is the direct
// path, a stage (FollowMove: moves, maintenance), a taker and an actor of
// Act; the Nova-native path (package novaresize) adds a stage, an actor
// and a taker.
type Paths struct {
	Stages  []Stage
	Results []ResultTaker
	Direct  DirectPath
}

// Use sets the paths. Call it before Run: a processor without them
// decides nothing (direct.Wire sets those of the direct path alone).
func (p *Processor) Use(ps Paths) {
	p.stages, p.results, p.direct = ps.Stages, ps.Results, ps.Direct
}

// Lent is what the processor lends the stages and the paths that act for
// it: its configuration (defaults applied), its collaborators, its
// counters and what a stage uses to take part in a decision, so that a
// stage or path works with the same Placement, policy and request store.
type Lent struct {
	Config    Config
	Deps      Deps
	Counters  Counters
	Decisions Decisions
}

// Lend returns what the stages and paths share with the processor.
func (p *Processor) Lend() Lent {
	return Lent{Config: p.cfg, Deps: p.d, Counters: Counters{p.m}, Decisions: p.dec}
}

// Wake makes the inbox loop look at the inbox now.
func (p *Processor) Wake() { p.wake.Wake() }

// Run processes the inbox until ctx ends. The deadlines of requests are
// watched by the path that runs them (direct.Path.Run, novaresize.Path.Run).
func (p *Processor) Run(ctx context.Context) error {
	if p.direct == nil {
		return errors.New("pipeline: no direct path (Use; direct.Wire)")
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.rel.run(ctx) // planned releases a crash or Placement left
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
		// ProcessOnce returns once the inbox had nothing more for it, or
		// nothing was committed since its last look: what comes later
		// wakes the loop, what becomes ready later waits for the poll.
		if _, err := p.ProcessOnce(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("pipeline: inbox poll failed", logkey.Err, err)
		}
		return p.cfg.PollInterval, nil
	})
}

// hostView re-reads the agents' changed reports (refreshHosts) when the
// cached view is old.
func (p *Processor) hostView(ctx context.Context) *hostSet {
	hs := p.hosts.Load()
	if time.Since(hs.at) < p.cfg.HostsRefresh {
		return hs
	}
	nh, err := refreshHosts(ctx, p.d.Pool, p.d.Catalog, hs)
	if err != nil {
		p.log.Warn("pipeline: cannot read hosts; using the last view", logkey.Err, err)
		return hs
	}
	p.hosts.Store(nh)
	return nh
}
