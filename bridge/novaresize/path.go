package novaresize

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// Nova is what the Nova-native path needs of Nova's compute API.
type Nova interface {
	Server(ctx context.Context, id, requestID string) (computeapi.Server, error)
	Flavors(ctx context.Context, requestID string) ([]computeapi.Flavor, error)
	Resize(ctx context.Context, id, flavorID, requestID string) error
	ConfirmResize(ctx context.Context, id, requestID string) error
	RevertResize(ctx context.Context, id, requestID string) error
	// Migrate cold-migrates a server; host "" lets Nova's scheduler choose.
	Migrate(ctx context.Context, id, host, requestID string) error
}

var _ Nova = (*computeapi.Client)(nil)

// Config times the Nova-native path.
type Config struct {
	// ResizeTimeout: from the resize call to instance.resize_finish.end.
	ResizeTimeout time.Duration
	// VerifyTimeout: the target host's agent must answer verify_vgpu.
	VerifyTimeout time.Duration
	// ConfirmTimeout: confirmResize (or revertResize) to its .end notification.
	ConfirmTimeout time.Duration
	// PollInterval: how often due Nova calls and passed deadlines are
	// looked for when nothing woke the loop.
	PollInterval time.Duration
	// CallLease: how long a replica holds a row while it calls Nova; past
	// it another replica may take the row over (it reads the server first).
	CallLease time.Duration
	// OnDeadline says what becomes of a resize that Nova finishes after
	// its deadline: OnDeadlineRevert (the default) or OnDeadlineConfirm.
	OnDeadline string
	// OverdueCheck: how often the server of an overdue resize is read.
	OverdueCheck time.Duration

	// Of the pipeline ([pipeline] options): Nova calls that fail are
	// retried with backoff between RetryMin and RetryMax, MaxAttempts times
	// in all; hosts whose agents have not reported for StaleReportAge
	// cannot verify a vGPU.
	RetryMin, RetryMax time.Duration
	MaxAttempts        int
	StaleReportAge     time.Duration
	// Replica names this bridge in the audit log.
	Replica string
}

// What becomes of a resize Nova finishes after its deadline.
const (
	OnDeadlineRevert  = "revert"  // revert it; the request fails with nova_timeout
	OnDeadlineConfirm = "confirm" // verify and confirm it as if it were on time
)

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.ResizeTimeout <= 0 {
		c.ResizeTimeout = d.ResizeTimeout
	}
	if c.VerifyTimeout <= 0 {
		c.VerifyTimeout = d.VerifyTimeout
	}
	if c.ConfirmTimeout <= 0 {
		c.ConfirmTimeout = d.ConfirmTimeout
	}
	if c.PollInterval <= 0 {
		c.PollInterval = d.PollInterval
	}
	if c.CallLease <= 0 {
		c.CallLease = d.CallLease
	}
	if c.OnDeadline != OnDeadlineConfirm {
		c.OnDeadline = OnDeadlineRevert
	}
	if c.OverdueCheck <= 0 {
		c.OverdueCheck = d.OverdueCheck
	}
	pd := pipeline.DefaultConfig()
	if c.RetryMin <= 0 {
		c.RetryMin = pd.RetryMin
	}
	if c.RetryMax <= 0 {
		c.RetryMax = pd.RetryMax
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = pd.MaxAttempts
	}
	if c.StaleReportAge <= 0 {
		c.StaleReportAge = pd.StaleReportAge
	}
}

// Pipeline is what the resize flow needs of the pipeline that hands it
// its requests (pipeline.Processor).
type Pipeline interface {
	// InTx runs fn in a transaction in which the Failer may run.
	InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error
	SucceedRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, reason string) error
}

// Capacity is the dry run that fails a resize fast (CanFit).
type Capacity interface {
	// CanFit reports whether a GPU of one of the hosts (compute host or
	// node names) has count free units of the type trait, from the mirror.
	CanFit(trait string, count int, hosts []string) (bool, error)
	// SoleType reports whether every GPU provider with VGPU inventory
	// offers exactly the type trait: then a flavor asking for VGPU
	// without a trait can only land on that type.
	SoleType(trait string) (bool, error)
}

// Controls are the operators' switches: "nova" paused stops the calls.
type Controls interface {
	Paused(ctx context.Context, part string) (bool, error)
}

// Deps are a Path's collaborators.
type Deps struct {
	Pool     *pgxpool.Pool
	Requests *requests.Store
	Pipeline Pipeline
	// Decisions are the pipeline's, for the decisions Act takes part in
	// (pipeline.Lent).
	Decisions pipeline.Decisions
	// Counters are the pipeline's (pipeline.Lent): compensations count
	// in one series whichever path made them.
	Counters pipeline.Counters
	// Fail fails a request and undoes what it began (the pipeline's
	// Failer, package direct).
	Fail    pipeline.Failer
	Catalog pipeline.Catalog // may be nil
	// Nova is Nova's compute API; nil: the path only records tenants'
	// resizes (Events) and acts on nothing.
	Nova     Nova
	Capacity Capacity // may be nil: no dry run
	Controls Controls // may be nil
	Log      *slog.Logger
}

// Path runs resizes through Nova: a pipeline stage (Events) and actor
// (Act), a result taker (TakeResult) and its own loop (Run) for the Nova
// calls and the deadlines of its steps.
type Path struct {
	cfg      Config
	nova     Nova
	pool     *pgxpool.Pool
	reqs     *requests.Store
	pipe     Pipeline
	dec      pipeline.Decisions
	count    pipeline.Counters
	fail     pipeline.Failer
	catalog  pipeline.Catalog
	capacity Capacity
	controls Controls
	log      *slog.Logger
	wake     chan struct{}
}

// New builds a Path.
func New(cfg Config, d Deps) *Path {
	cfg.setDefaults()
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Requests == nil {
		d.Requests = requests.NewStore(d.Pool, "vgpu-bridge")
	}
	return &Path{cfg: cfg, nova: d.Nova, pool: d.Pool, reqs: d.Requests, pipe: d.Pipeline, dec: d.Decisions, count: d.Counters, fail: d.Fail, catalog: d.Catalog,
		capacity: d.Capacity, controls: d.Controls, log: d.Log, wake: make(chan struct{}, 1)}
}

func (p *Path) actor() string { return "vgpu-bridge/" + p.cfg.Replica }

// paused reports whether operators paused the Nova calls; errors count as
// not paused.
func (p *Path) paused(ctx context.Context) bool {
	if p.controls == nil {
		return false
	}
	held, err := p.controls.Paused(ctx, "nova")
	if err != nil {
		p.log.Warn("nova resize: cannot read the operator controls", logkey.Err, err)
		return false
	}
	return held
}

// Events is the stage that follows Nova's notifications into the resize
// of their instance; it goes before the policy sees them.
func (p *Path) Events() pipeline.Stage {
	return pipeline.StageFunc(func(ctx context.Context, w *pipeline.Work) (bool, error) {
		handled, outbox, err := p.event(ctx, w)
		w.Outbox = w.Outbox || outbox
		return handled, err
	})
}

// TakeResult takes the agent's answer to a verify_vgpu of a resize.
func (p *Path) TakeResult(ctx context.Context, tx pgx.Tx, ar *pipeline.AgentResult) (bool, error) {
	c := ar.Command
	if c.Purpose == requests.PurposeCompensation || c.Kind != string(protocol.VerifyVGPU) {
		return false, nil // compensation commands are the direct path's, whatever their kind
	}
	return p.result(ctx, tx, *c.Request, c.Host, c.Kind, ar.Result)
}

// Kinds of a Nova-path resize (nova_resizes.kind).
const (
	KindAttach  = "attach"  // from a flavor without vGPU to one with
	KindResize  = "resize"  // to a flavor with another profile or count
	KindRelease = "release" // to the flavor without vGPU
	// KindMove is a cold migration (Nova's migrate action, the same
	// flavor) that moves the flavor's vGPU off a GPU (LeaveGPU): Nova
	// follows it with the resize's notifications, verify and confirm.
	KindMove = "move"
)

// Steps of nova_resizes.
const (
	stepResize     = "resize"
	stepResizing   = "resizing"
	stepVerifying  = "verifying"
	stepConfirm    = "confirm"
	stepConfirming = "confirming"
	stepRevert     = "revert"
	stepReverting  = "reverting"
	stepDone       = "done"
)

// NovaRequestID is the X-OpenStack-Request-ID of the bridge's Nova calls
// for a request: Nova's notifications carry it as global_request_id.
func NovaRequestID(reqID uuid.UUID) string { return "req-" + reqID.String() }

func (p *Path) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// wrapErr prefixes a function's error with what it was doing.
func wrapErr(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf(format+": %w", append(args, *errp)...)
	}
}
