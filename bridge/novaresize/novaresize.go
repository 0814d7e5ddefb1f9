// Package novaresize is the Nova-native path of the bridge: Nova claims
// the vGPU, not the bridge. The bridge resizes the server to a flavor
// carrying the wanted vGPU (attach), another profile or count (resize) or
// none (release), and lets Nova's scheduler claim; it only dry-runs
// Placement to fail fast. A request moves
//
//	decided/queued → dispatched/resizing   the resize call (nova_resizes.step resize → resizing)
//	  → dispatched/verifying               instance.resize_finish.end: verify_vgpu to the target host's agent
//	                                       (a release has nothing to verify and goes on to confirm)
//	  → dispatched/confirming              the agent verified: confirmResize
//	  → succeeded                          instance.resize_confirm.end (or the server ACTIVE on the new flavor)
//
// A failed verification reverts (phase compensating, revertResize) and the
// request fails with the agent's reason; compute_task.migrate_server.error
// (NoValidHost) and instance.resize*.error fail it with Nova's. Each step
// has a deadline; a resize Nova is still working on at its deadline is
// followed to its end (phase overdue) and then reverted or confirmed as
// Config.OnDeadline says. A request cancelled mid-resize is reverted.
// The state lives in nova_resizes; Nova calls are made by one replica at
// a time under a lease, and a call is preceded by a read of the server,
// so a call a crash interrupted is not made twice.
package novaresize

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Nova is what the Nova-native path needs of Nova's compute API.
type Nova interface {
	Server(ctx context.Context, id, requestID string) (computeapi.Server, error)
	Flavors(ctx context.Context, requestID string) ([]computeapi.Flavor, error)
	Resize(ctx context.Context, id, flavorID, requestID string) error
	ConfirmResize(ctx context.Context, id, requestID string) error
	RevertResize(ctx context.Context, id, requestID string) error
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
	// InTx runs fn in a transaction in which FailRequest may run.
	InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error
	FailRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string) error
	SucceedRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, reason string) error
	Compensated(step string)
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
	Catalog  pipeline.Catalog // may be nil
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
	return &Path{cfg: cfg, nova: d.Nova, pool: d.Pool, reqs: d.Requests, pipe: d.Pipeline, catalog: d.Catalog,
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
func (p *Path) TakeResult(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, host, kind string, res protocol.Result) (bool, error) {
	if kind != string(protocol.VerifyVGPU) {
		return false, nil
	}
	return p.result(ctx, tx, reqID, host, kind, res)
}

// Phases of a Nova-path request.
const (
	PhaseResizing   = "resizing"
	PhaseVerifying  = "verifying"
	PhaseConfirming = "confirming"
	// PhaseOverdue: Nova still resizes past the step's deadline; the
	// bridge follows the resize to its end.
	PhaseOverdue = "overdue"
)

// Kinds of a Nova-path resize (nova_resizes.kind).
const (
	KindAttach  = "attach"  // from a flavor without vGPU to one with
	KindResize  = "resize"  // to a flavor with another profile or count
	KindRelease = "release" // to the flavor without vGPU
)

// Request codes of the Nova-native path.
const (
	CodeNoFlavor     = "no_flavor"     // no flavor carries the vGPU; the reason names the one to create
	CodeNovaFailed   = "nova_failed"   // Nova could not resize (NoValidHost, a compute error)
	CodeNovaError    = "nova_error"    // Nova's API refused a call
	CodeNovaTimeout  = "nova_timeout"  // a step did not end by its deadline
	CodeVerifyFailed = "verify_failed" // the agent did not find the vGPU; the resize was reverted
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

// verifiableHosts are the compute hosts (and their nodes) whose agents
// report, less excluded ones: where a vGPU Nova gives can be verified.
func (p *Path) verifiableHosts(ctx context.Context, q pipeline.Querier, exclude []policy.Exclusion) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT name, coalesce(node, '') FROM hosts WHERE report IS NOT NULL
		AND (last_report_at IS NULL OR last_report_at > now() - make_interval(secs => $1))`, p.cfg.StaleReportAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("read hosts: %w", err)
	}
	defer rows.Close()
	skip := map[string]bool{}
	for _, e := range exclude {
		skip[e.Host] = true
	}
	var out []string
	for rows.Next() {
		var name, node string
		if err := rows.Scan(&name, &node); err != nil {
			return nil, err
		}
		if skip[name] || (node != "" && skip[node]) {
			continue
		}
		out = append(out, name)
		if node != "" {
			out = append(out, node)
		}
	}
	return out, rows.Err()
}

// Act runs a plan with a Nova resize step in the decision's transaction
// (pipeline.Actor): checks, the dry run, and the nova_resizes row whose
// resize call the loop makes. Failures end the request (Work.Fail).
func (p *Path) Act(ctx context.Context, w *pipeline.Work, s pipeline.Step) (err error) {
	defer wrapErr(&err, "resize through Nova")
	tx, reqID, f := w.Tx, w.Request, w.Facts
	fail := func(code, reason string) error { return w.Fail(ctx, code, reason) }
	if p.nova == nil {
		return fail(pipeline.CodeNovaPath, "the Nova-native path needs Nova's API: set [nova] endpoint_override and token_file, or [openstack] cloud")
	}
	for _, o := range w.Plan.Steps {
		switch o.Kind {
		case pipeline.StepNotify:
			if err := w.Notify(ctx, []pipeline.Step{o}); err != nil {
				return err
			}
		case pipeline.StepNovaResize:
		default:
			w.Plan.Notes = append(w.Plan.Notes, fmt.Sprintf("%s: not applied with a Nova resize in the same decision", o.Kind))
		}
	}
	in := s.Intent
	n := max(in.Count, 1)
	kind := KindAttach
	switch in.Kind {
	case policy.IntentRelease:
		kind, n = KindRelease, 0
		if f.Instance.FlavorVGPUs == 0 {
			return fail(pipeline.CodeUnsupported, fmt.Sprintf("instance %s has no vGPU from its flavor to give back", f.Instance.UUID))
		}
	case policy.IntentResize:
		kind = KindResize
		if in.Count == 0 {
			n = max(f.Instance.FlavorVGPUs, 1) // a profile change keeps the count
		}
	default:
		if f.Instance.FlavorVGPUs > 0 {
			return fail(pipeline.CodeUnsupported, fmt.Sprintf("instance %s already has %d vGPU(s) from its flavor; "+
				"a GPU_RESIZE (policy intent resize) changes them through Nova, a GPU_RELEASE gives them back", f.Instance.UUID, f.Instance.FlavorVGPUs))
		}
	}
	if len(f.Attachments) > 0 {
		// A resize rewrites the instance's allocations: the bridge's own
		// claims would have to follow (move.go) while it resizes.
		return fail(pipeline.CodeUnsupported, fmt.Sprintf("instance %s holds %d direct-path vGPU(s); release them before a resize through Nova, or use attach_mode direct-live",
			f.Instance.UUID, len(f.Attachments)))
	}
	var busy uuid.UUID
	err = tx.QueryRow(ctx, `SELECT request_id FROM nova_resizes WHERE instance_uuid = $1 AND step <> 'done'`, f.Instance.UUID).Scan(&busy)
	switch {
	case err == nil:
		return fail(pipeline.CodeBusy, fmt.Sprintf("request %s is resizing this instance through Nova; retry when it is finished", busy))
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	untyped := false
	if p.capacity != nil && kind != KindRelease {
		if untyped, err = p.capacity.SoleType(in.Trait); err != nil {
			return pipeline.Retry(fmt.Errorf("read the GPUs' types: %w", err))
		}
		hosts, err := p.verifiableHosts(ctx, tx, in.ExcludedHosts)
		if err != nil {
			return err
		}
		fits, err := p.capacity.CanFit(in.Trait, n, hosts)
		if err != nil {
			return pipeline.Retry(fmt.Errorf("dry run: %w", err))
		}
		if !fits {
			return fail(pipeline.CodeNoCapacity, fmt.Sprintf("no GPU of a host whose agent reports has %d free unit(s) of %s (%s) in Placement; "+
				"Nova's scheduler would answer NoValidHost (or pick a host the bridge cannot verify), so Nova was not called", n, in.Profile, in.Trait))
		}
	}
	if kind == KindRelease {
		in.Profile, in.TypeID, in.Trait = "", "", ""
	}
	// A resize under way counts in the project's usage: lock it now, and
	// stop if it moved since the decision read it.
	if err := pipeline.LockQuota(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO nova_resizes (request_id, instance_uuid, step, profile, type_id, trait, count, source_host,
			nova_request_id, due_at, deadline_at, kind, untyped)
		VALUES ($1, $2, 'resize', $3, $4, $5, $6, $7, $8, now(), now() + make_interval(secs => $9), $10, $11)`,
		reqID, f.Instance.UUID, in.Profile, in.TypeID, in.Trait, n, f.Instance.Host, NovaRequestID(reqID), (p.cfg.ResizeTimeout + p.cfg.CallLease).Seconds(),
		kind, untyped); err != nil {
		return fmt.Errorf("record the resize: %w", err)
	}
	reason := fmt.Sprintf("resize through Nova to a flavor with %d × %s", n, in.Profile)
	if kind == KindRelease {
		reason = "resize through Nova to the flavor without vGPU"
	}
	if len(w.Plan.Notes) > 0 {
		reason += "; " + strings.Join(w.Plan.Notes, "; ")
	}
	if err := w.Decided(ctx, pipeline.PhaseQueued, reason); err != nil {
		return err
	}
	p.kick()
	return nil
}

func (p *Path) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// resizeRow is one nova_resizes row.
type resizeRow struct {
	RequestID      uuid.UUID
	Instance       string
	Step           string
	Profile        string
	TypeID         string
	Trait          string
	Count          int
	OldFlavor      string
	FlavorID       string
	FlavorName     string
	SourceHost     string
	TargetHost     string
	VerifyCommand  *uuid.UUID
	NovaRequestID  string
	FailCode       string
	FailReason     string
	Attempts       int
	ResizeSent     bool // a resize call may have reached Nova
	RequestState   requests.State
	RequestPhase   string
	DeadlinePassed bool
	Kind           string
	Untyped        bool
	Overdue        bool // the step passed its deadline while Nova worked
}

const resizeColumns = `r.request_id, r.instance_uuid::text, r.step, coalesce(r.profile,''), coalesce(r.type_id,''), r.trait, r.count,
	coalesce(r.old_flavor,''), coalesce(r.flavor_id,''), coalesce(r.flavor_name,''), coalesce(r.source_host,''), coalesce(r.target_host,''),
	r.verify_command_id, r.nova_request_id, coalesce(r.fail_code,''), coalesce(r.fail_reason,''), r.attempts, r.resize_sent_at IS NOT NULL, q.state, coalesce(q.phase,''),
	coalesce(r.deadline_at < now(), false), r.kind, r.untyped, r.overdue_at IS NOT NULL`

// lockResize reads a nova_resizes row and its request, both locked.
func lockResize(ctx context.Context, tx pgx.Tx, where string, skipLocked bool, args ...any) (resizeRow, bool, error) {
	var r resizeRow
	lock := "FOR UPDATE"
	if skipLocked {
		lock += " SKIP LOCKED"
	}
	var st string
	err := tx.QueryRow(ctx, `SELECT `+resizeColumns+` FROM nova_resizes r JOIN requests q ON q.id = r.request_id WHERE `+where+` LIMIT 1 `+lock, args...).
		Scan(&r.RequestID, &r.Instance, &r.Step, &r.Profile, &r.TypeID, &r.Trait, &r.Count, &r.OldFlavor, &r.FlavorID, &r.FlavorName,
			&r.SourceHost, &r.TargetHost, &r.VerifyCommand, &r.NovaRequestID, &r.FailCode, &r.FailReason, &r.Attempts, &r.ResizeSent, &st, &r.RequestPhase,
			&r.DeadlinePassed, &r.Kind, &r.Untyped, &r.Overdue)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("read nova resize: %w", err)
	}
	r.RequestState = requests.State(st)
	return r, true, nil
}

func (r resizeRow) want() computeapi.Want {
	return computeapi.Want{Profile: r.Profile, Trait: r.Trait, Count: r.Count, Untyped: r.Untyped}
}

// onTarget reports whether a server's flavor is the one the resize goes
// to: the chosen flavor once known, else one that carries the wanted vGPU
// (none for a release).
func (r resizeRow) onTarget(f computeapi.Flavor) bool {
	switch {
	case r.FlavorName != "":
		return f.Name == r.FlavorName
	case r.Kind == KindRelease:
		return !computeapi.HasVGPU(f)
	}
	return computeapi.CarriesVGPU(f, r.want())
}

// what says what the resize gives, for reasons: "1 × T4-4Q" or "no vGPU".
func (r resizeRow) what() string {
	if r.Kind == KindRelease {
		return "no vGPU"
	}
	return fmt.Sprintf("%d × %s", r.Count, r.Profile)
}

// setStep moves a row to step; deadline 0 clears it, due sets the next
// call's time (nil: no call due).
func setStep(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, step string, deadline time.Duration, due bool, sets string, args ...any) error {
	q := `UPDATE nova_resizes SET step = $2, updated_at = now(),
		deadline_at = CASE WHEN $3::float8 > 0 THEN now() + make_interval(secs => $3) ELSE NULL END,
		due_at = CASE WHEN $4 THEN now() ELSE NULL END,
		finished_at = CASE WHEN $2 = 'done' THEN now() ELSE NULL END` + sets + ` WHERE request_id = $1`
	_, err := tx.Exec(ctx, q, append([]any{reqID, step, deadline.Seconds(), due}, args...)...)
	if err != nil {
		return fmt.Errorf("nova resize %s → %s: %w", reqID, step, err)
	}
	return nil
}

func (p *Path) auditNova(ctx context.Context, tx pgx.Tx, r resizeRow, action string, detail map[string]any) error {
	detail["nova_request_id"] = r.NovaRequestID
	d, _ := json.Marshal(detail)
	_, err := tx.Exec(ctx, `INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail)
		VALUES ($1, $2, 'instance', $3, $4, $5)`, p.actor(), action, r.Instance, r.RequestID.String(), d)
	return err
}

// finishFailed ends a resize and fails its request (unless it already ended).
func (p *Path) finishFailed(ctx context.Context, tx pgx.Tx, r resizeRow, code, reason string) (err error) {
	defer wrapErr(&err, "end resize %s as failed", r.RequestID)
	if err := setStep(ctx, tx, r.RequestID, stepDone, 0, false, ""); err != nil {
		return err
	}
	if r.RequestState.Final() {
		return p.auditNova(ctx, tx, r, "nova_resize_end", map[string]any{"outcome": "failed", "code": code, "reason": reason,
			"note": "the request had ended already"})
	}
	return p.pipe.FailRequest(ctx, tx, r.RequestID, code, reason)
}

func (p *Path) finishSucceeded(ctx context.Context, tx pgx.Tx, r resizeRow, how string) (err error) {
	defer wrapErr(&err, "end resize %s as succeeded", r.RequestID)
	if err := setStep(ctx, tx, r.RequestID, stepDone, 0, false, ""); err != nil {
		return err
	}
	reason := fmt.Sprintf("resized through Nova to flavor %s (%s) on host %s; the agent verified the vGPU; %s",
		r.FlavorName, r.what(), cmp.Or(r.TargetHost, "?"), how)
	if r.Kind == KindRelease {
		reason = fmt.Sprintf("resized through Nova to flavor %s (no vGPU) on host %s; %s", r.FlavorName, cmp.Or(r.TargetHost, "?"), how)
	}
	if r.Overdue {
		reason += fmt.Sprintf(" (after its deadline; [nova] on_deadline = %s)", p.cfg.OnDeadline)
	}
	// The change is recorded (bridge.vgpu_changed) whether or not the
	// request had ended: the server is on the new flavor either way.
	if err := pipeline.RecordChange(ctx, tx, pipeline.Change{Request: r.RequestID, Instance: r.Instance, Change: r.Kind, Path: pipeline.PathNova,
		Profile: r.Profile, Host: r.TargetHost}); err != nil {
		return err
	}
	if r.RequestState.Final() {
		return p.auditNova(ctx, tx, r, "nova_resize_end", map[string]any{"outcome": "succeeded", "reason": reason, "note": "the request had ended already"})
	}
	if err := p.pipe.SucceedRequest(ctx, tx, r.RequestID, reason); err != nil {
		return err
	}
	p.log.Info("nova resize: succeeded", logkey.RequestID, r.RequestID, logkey.Instance, r.Instance, "flavor", r.FlavorName, logkey.Host, r.TargetHost)
	return nil
}

// startRevert makes revertResize due; the request fails with code and
// reason once Nova reverted.
func (p *Path) startRevert(ctx context.Context, tx pgx.Tx, r resizeRow, code, reason string) (err error) {
	defer wrapErr(&err, "revert resize %s", r.RequestID)
	if err := setStep(ctx, tx, r.RequestID, stepRevert, 0, true, ", fail_code = $5, fail_reason = $6, attempts = 0", code, reason); err != nil {
		return err
	}
	if !r.RequestState.Final() {
		if _, err := p.reqs.Transition(ctx, tx, r.RequestID, r.RequestState, pipeline.PhaseCompensating, "reverting the resize: "+reason, code); err != nil {
			return err
		}
	}
	p.pipe.Compensated("resize_reverted")
	return p.auditNova(ctx, tx, r, "compensate", map[string]any{"revert_resize": true, "code": code, "reason": reason})
}

// finished goes on from a resize Nova finished (VERIFY_RESIZE) on host:
// to the agent's verification, or straight to the confirm for a release
// (there is no vGPU to verify); a resize that finished after its deadline
// is reverted instead when [nova] on_deadline says so. outbox is true
// when a command was queued.
func (p *Path) finished(ctx context.Context, tx pgx.Tx, r resizeRow, host string) (outbox bool, err error) {
	if (r.Overdue || r.DeadlinePassed) && p.cfg.OnDeadline == OnDeadlineRevert {
		r.TargetHost = host
		if _, err := tx.Exec(ctx, `UPDATE nova_resizes SET target_host = $2 WHERE request_id = $1`, r.RequestID, host); err != nil {
			return false, err
		}
		return false, p.startRevert(ctx, tx, r, CodeNovaTimeout, fmt.Sprintf("Nova finished the resize to %s on host %s after its deadline (%s); "+
			"reverting it as [nova] on_deadline = revert says", cmp.Or(r.FlavorName, "the new flavor"), host, p.cfg.ResizeTimeout))
	}
	if r.Kind != KindRelease {
		return true, p.queueVerify(ctx, tx, r, host)
	}
	if err := setStep(ctx, tx, r.RequestID, stepConfirm, 0, true, ", target_host = $5, attempts = 0", host); err != nil {
		return false, err
	}
	if !r.RequestState.Final() {
		to := r.RequestState
		if to == requests.Decided {
			to = requests.Dispatched
		}
		if _, err := p.reqs.Transition(ctx, tx, r.RequestID, to, PhaseConfirming,
			fmt.Sprintf("Nova finished the resize to %s (no vGPU) on host %s; confirming it", cmp.Or(r.FlavorName, "the new flavor"), host), ""); err != nil {
			return false, err
		}
	}
	p.kick()
	return false, nil
}

// queueVerify sends verify_vgpu to the target host's agent.
func (p *Path) queueVerify(ctx context.Context, tx pgx.Tx, r resizeRow, host string) (err error) {
	defer wrapErr(&err, "verify resize %s on host %s", r.RequestID, host)
	now := time.Now()
	c, err := pipeline.NewCommand(protocol.VerifyVGPU, host, r.RequestID.String(), r.Instance,
		protocol.VerifyParams{TypeID: r.TypeID, Count: r.Count}, now, now.Add(p.cfg.VerifyTimeout))
	if err != nil {
		return err
	}
	if err := pipeline.QueueAction(ctx, tx, r.RequestID, c); err != nil {
		return err
	}
	if err := setStep(ctx, tx, r.RequestID, stepVerifying, p.cfg.VerifyTimeout, false, ", target_host = $5, verify_command_id = $6", host, c.ID); err != nil {
		return err
	}
	if !r.RequestState.Final() {
		to := r.RequestState
		if to == requests.Decided {
			to = requests.Dispatched
		}
		if _, err := p.reqs.Transition(ctx, tx, r.RequestID, to, PhaseVerifying,
			fmt.Sprintf("Nova finished the resize to %s on host %s; the agent verifies the vGPU", cmp.Or(r.FlavorName, "the new flavor"), host), ""); err != nil {
			return err
		}
	}
	return nil
}

// event follows a Nova notification into the resize of its instance.
// handled is true when the event belonged to a bridge resize (the policy
// does not see it); outbox when a command was queued.
func (p *Path) event(ctx context.Context, w *pipeline.Work) (handled, outbox bool, err error) {
	defer wrapErr(&err, "event %d of instance %s", w.Row.ID, w.Row.InstanceUUID)
	tx, row := w.Tx, w.Row
	if row.Webhook() || row.InstanceUUID == "" {
		return false, false, nil
	}
	et := row.EventType
	finish := et == "instance.resize_finish.end"
	novaErr := et == "compute_task.migrate_server.error" || (strings.HasPrefix(et, "instance.resize") && strings.HasSuffix(et, ".error"))
	confirmed := et == "instance.resize_confirm.end"
	reverted := et == "instance.resize_revert.end"
	if !finish && !novaErr && !confirmed && !reverted {
		return false, false, nil
	}
	if p.nova == nil {
		return false, false, p.tenantResize(ctx, w, finish)
	}
	r, ok, err := lockResize(ctx, tx, `r.instance_uuid = $1 AND r.step <> 'done'`, false, row.InstanceUUID)
	if err != nil {
		return false, false, err
	}
	if !ok {
		return false, false, p.tenantResize(ctx, w, finish)
	}
	pl := decodeNovaPayload(row.Payload)
	if err := p.auditNova(ctx, tx, r, "nova_event", map[string]any{"event_type": et, "event_id": row.ID, "step": r.Step}); err != nil {
		return false, false, err
	}
	switch {
	case finish && (r.Step == stepResize || r.Step == stepResizing):
		host := pl.host
		if host == "" {
			host = r.SourceHost
		}
		if r.RequestState.Final() {
			r.TargetHost = host
			return true, false, p.startRevert(ctx, tx, r, CodeNovaFailed, "the request ended while Nova resized")
		}
		if r.FlavorName == "" {
			r.FlavorName = pl.flavor
			if _, err := tx.Exec(ctx, `UPDATE nova_resizes SET flavor_name = $2 WHERE request_id = $1`, r.RequestID, pl.flavor); err != nil {
				return false, false, err
			}
		}
		outbox, err := p.finished(ctx, tx, r, host)
		return true, outbox, err
	case novaErr && (r.Step == stepResize || r.Step == stepResizing):
		why := pl.reason
		if why == "" {
			why = "no reason given"
		}
		return true, false, p.finishFailed(ctx, tx, r, CodeNovaFailed,
			fmt.Sprintf("Nova could not resize instance %s to flavor %s (%s): %s", r.Instance, cmp.Or(r.FlavorName, "?"), et, why))
	case confirmed && (r.Step == stepConfirm || r.Step == stepConfirming):
		return true, false, p.finishSucceeded(ctx, tx, r, "Nova confirmed the resize")
	case reverted && (r.Step == stepRevert || r.Step == stepReverting):
		return true, false, p.finishFailed(ctx, tx, r, cmp.Or(r.FailCode, CodeVerifyFailed), r.FailReason+"; Nova reverted the resize")
	case novaErr && (r.Step == stepConfirm || r.Step == stepConfirming || r.Step == stepRevert || r.Step == stepReverting):
		return true, false, p.finishFailed(ctx, tx, r, CodeNovaFailed,
			fmt.Sprintf("Nova failed while %s the resize of instance %s (%s): %s", map[bool]string{true: "confirming", false: "reverting"}[r.Step == stepConfirm || r.Step == stepConfirming],
				r.Instance, et, cmp.Or(pl.reason, "no reason given")))
	}
	return true, false, nil // a late or repeated notification of this resize
}

type novaPayload struct {
	host, flavor, reason string
	vgpus                int
	traits               []string
}

// decodeNovaPayload reads what the Nova path needs of an event's payload
// (a nova_object): the host, the flavor's name and vGPU demand, and the
// reason of a compute task's error or the instance's fault.
func decodeNovaPayload(raw json.RawMessage) novaPayload {
	var out novaPayload
	var o nova.Object
	if json.Unmarshal(raw, &o) != nil {
		return out
	}
	pl, _ := nova.DecodeObject(o)
	exc := func(e *nova.Exception) string {
		if e == nil {
			return ""
		}
		// Remote exceptions carry the traceback after the message.
		msg, _, _ := strings.Cut(strings.TrimSpace(e.ExceptionMessage), "\n")
		if msg = strings.TrimSpace(msg); msg != "" && e.Exception != "" {
			return e.Exception + ": " + msg
		}
		return e.Exception + msg
	}
	switch x := pl.(type) {
	case *nova.InstanceAction:
		if x.Host != nil {
			out.host = *x.Host
		}
		if x.Flavor != nil {
			out.flavor = x.Flavor.Name
			if d, err := nova.ParseExtraSpecs(x.Flavor.ExtraSpecs); err == nil {
				out.vgpus = d.VGPUs()
				for _, g := range d.VGPUGroups() {
					out.traits = append(out.traits, g.Required...)
				}
			}
		}
		out.reason = exc(x.Fault)
	case *nova.ComputeTask:
		out.reason = exc(x.Reason)
	}
	return out
}

// tenantResize records a resize to a vGPU flavor the bridge did not ask
// for (a tenant's): the instance's vGPU demand is in instances (ingest);
// this records it in the audit log and, before the policy sees the event,
// waits (pipeline.Retry) until the host's agent reports the vGPU, so the
// policy's tuning intents know its physical GPU.
func (p *Path) tenantResize(ctx context.Context, w *pipeline.Work, finish bool) (err error) {
	defer wrapErr(&err, "record the resize of instance %s", w.Row.InstanceUUID)
	tx, row := w.Tx, w.Row
	if !finish {
		return nil
	}
	pl := decodeNovaPayload(row.Payload)
	if pl.vgpus == 0 {
		return nil
	}
	v, reported, err := pipeline.ReportedVGPU(ctx, tx, p.catalog, row.InstanceUUID, pl.host)
	if err != nil {
		return err
	}
	if reported && v.GPU == "" && !w.LastAttempt() {
		return pipeline.Retry(fmt.Errorf("instance %s was resized to vGPU flavor %s on host %s: waiting for its agent to report the vGPU", row.InstanceUUID, pl.flavor, pl.host))
	}
	d, _ := json.Marshal(map[string]any{"event_id": row.ID, "event_type": row.EventType, "flavor": pl.flavor, "vgpus": pl.vgpus,
		"traits": pl.traits, "host": pl.host, "gpu": v.GPU, "profile": v.Profile, "nova_request_id": row.RequestID})
	_, err = tx.Exec(ctx, `INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail)
		VALUES ($1, 'vgpu_recorded', 'instance', $2, NULL, $3)`, p.actor(), row.InstanceUUID, d)
	return err
}

// result takes the agent's answer to a verify_vgpu of the Nova path.
// handled is false for results of other requests.
func (p *Path) result(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, host, kind string, res protocol.Result) (_ bool, err error) {
	defer wrapErr(&err, "verification of resize %s", reqID)
	r, ok, err := lockResize(ctx, tx, `r.request_id = $1`, false, reqID)
	if err != nil || !ok {
		return false, err
	}
	if r.Step != stepVerifying || r.VerifyCommand == nil || r.VerifyCommand.String() != strings.ToLower(res.CommandID) {
		return true, nil // an old verification
	}
	if err := p.auditNova(ctx, tx, r, "nova_verify", map[string]any{"command_id": res.CommandID, "status": res.Status, "code": res.Code,
		"message": res.Message, "details": res.Details}); err != nil {
		return true, err
	}
	if res.Status != protocol.Succeeded {
		return true, p.startRevert(ctx, tx, r, CodeVerifyFailed, pipeline.DescribeResult(host, kind, res))
	}
	if r.RequestState.Final() {
		return true, p.startRevert(ctx, tx, r, CodeVerifyFailed, "the request ended while the agent verified the vGPU")
	}
	if err := setStep(ctx, tx, r.RequestID, stepConfirm, 0, true, ", attempts = 0"); err != nil {
		return true, err
	}
	if _, err := p.reqs.Transition(ctx, tx, r.RequestID, r.RequestState, PhaseConfirming,
		fmt.Sprintf("the agent of host %s verified %s; confirming the resize", host, r.what()), ""); err != nil {
		return true, err
	}
	p.kick()
	return true, nil
}

// Run makes the due Nova calls and handles passed deadlines until ctx
// ends; without Nova's API it returns at once.
func (p *Path) Run(ctx context.Context) error {
	if p.nova == nil {
		return nil
	}
	t := time.NewTicker(p.cfg.PollInterval)
	defer t.Stop()
	for {
		for ctx.Err() == nil && !p.paused(ctx) {
			did, err := p.Once(ctx)
			if err != nil && ctx.Err() == nil {
				p.log.Warn("nova resize: step failed", logkey.Err, err)
				break
			}
			if !did {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-p.wake:
		}
	}
}

// Once makes one due Nova call or handles one passed deadline; it reports
// whether it found one.
func (p *Path) Once(ctx context.Context) (bool, error) {
	if p.nova == nil {
		return false, nil
	}
	did, err := p.due(ctx)
	if did || err != nil {
		return did, err
	}
	return p.deadline(ctx)
}

// due leases one row whose call is due (its due_at moves past the
// lease, its attempts count up, committed), makes the call outside any
// transaction, then records the outcome under the row's lock.
func (p *Path) due(ctx context.Context) (_ bool, err error) {
	defer wrapErr(&err, "due Nova call")
	var r resizeRow
	found := false
	err = p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var ok bool
		var err error
		r, ok, err = lockResize(ctx, tx, `r.step IN ('resize','confirm','revert') AND r.due_at <= now() ORDER BY r.due_at`, true)
		if err != nil || !ok {
			return err
		}
		found = true
		r.Attempts++
		_, err = tx.Exec(ctx, `UPDATE nova_resizes SET due_at = now() + make_interval(secs => $2), attempts = $3, updated_at = now() WHERE request_id = $1`,
			r.RequestID, p.cfg.CallLease.Seconds(), r.Attempts)
		return err
	})
	if err != nil || !found {
		return found, err
	}
	out := p.callNova(ctx, r)
	return true, p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		cur, ok, err := lockResize(ctx, tx, `r.request_id = $1`, false, r.RequestID)
		if err != nil || !ok {
			return err
		}
		if cur.Step != r.Step || cur.Attempts != r.Attempts {
			// A notification moved the row on meanwhile (or another replica
			// took it over): the call is recorded, the row is not touched.
			return p.auditNova(ctx, tx, cur, "nova_call", out.audit)
		}
		if err := p.auditNova(ctx, tx, cur, "nova_call", out.audit); err != nil {
			return err
		}
		return out.apply(ctx, tx, cur)
	})
}

// callOutcome is what a Nova call did, applied under the row's lock.
type callOutcome struct {
	audit map[string]any
	apply func(ctx context.Context, tx pgx.Tx, r resizeRow) error
}

// retryOrFail reschedules a call after a retryable error, or fails the
// request after MaxAttempts or a final error.
func (p *Path) retryOrFail(op string, err error, failCode string) callOutcome {
	return callOutcome{audit: map[string]any{"call": op, "error": err.Error()}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
		if computeapi.IsRetryable(err) && r.Attempts < p.cfg.MaxAttempts {
			wait := backoff.Policy{Min: p.cfg.RetryMin, Max: p.cfg.RetryMax}.Delay(r.Attempts - 1)
			_, e := tx.Exec(ctx, `UPDATE nova_resizes SET due_at = now() + make_interval(secs => $2), last_error = $3, updated_at = now() WHERE request_id = $1`,
				r.RequestID, wait.Seconds(), err.Error())
			return e
		}
		reason := fmt.Sprintf("%s: %v", op, err)
		if r.Step == stepRevert {
			reason = r.FailReason + "; and the revert failed: " + reason
			failCode = cmp.Or(r.FailCode, failCode)
		}
		return p.finishFailed(ctx, tx, r, failCode, reason)
	}}
}

func (p *Path) callNova(ctx context.Context, r resizeRow) callOutcome {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallLease/2)
	defer cancel()
	nc, id := p.nova, r.NovaRequestID
	srv, err := nc.Server(cctx, r.Instance, id)
	if computeapi.IsNotFound(err) {
		return callOutcome{audit: map[string]any{"call": "get server", "error": err.Error()}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishFailed(ctx, tx, r, pipeline.CodeNoInstance, fmt.Sprintf("Nova has no server %s", r.Instance))
		}}
	}
	if err != nil {
		return p.retryOrFail("get server", err, CodeNovaError)
	}
	state := map[string]any{"status": srv.Status, "task_state": srv.TaskState, "host": srv.Host, "flavor": srv.Flavor.Name}
	switch r.Step {
	case stepResize:
		return p.callResize(cctx, r, srv, state)
	case stepConfirm:
		return p.callConfirm(cctx, r, srv, state)
	default:
		return p.callRevert(cctx, r, srv, state)
	}
}

func (p *Path) callResize(ctx context.Context, r resizeRow, srv computeapi.Server, state map[string]any) callOutcome {
	if r.RequestState.Final() {
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "the request ended before the resize"},
			apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
				return setStep(ctx, tx, r.RequestID, stepDone, 0, false, "")
			}}
	}
	if srv.Resizing() || (r.ResizeSent && r.onTarget(srv.Flavor)) {
		if r.ResizeSent {
			// An earlier attempt's call reached Nova before its outcome was
			// recorded: follow that resize.
			return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "a resize is under way: an earlier attempt's call"},
				apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
					if srv.Status == "VERIFY_RESIZE" {
						r.FlavorName = srv.Flavor.Name
						if _, err := tx.Exec(ctx, `UPDATE nova_resizes SET flavor_name = $2 WHERE request_id = $1`, r.RequestID, srv.Flavor.Name); err != nil {
							return err
						}
						_, err := p.finished(ctx, tx, r, srv.Host)
						return err
					}
					if !srv.Resizing() { // confirmed already
						r.FlavorName, r.TargetHost = srv.Flavor.Name, srv.Host
						return p.finishSucceeded(ctx, tx, r, "the server was found on the flavor")
					}
					return p.resizeCalled(ctx, tx, r, "", srv.Flavor.Name, srv.Flavor.Name)
				}}
		}
		return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishFailed(ctx, tx, r, pipeline.CodeBusy, fmt.Sprintf("server %s is being resized already (status %s, task state %s); retry when it is finished",
				r.Instance, srv.Status, cmp.Or(srv.TaskState, "none")))
		}}
	}
	flavors, err := p.nova.Flavors(ctx, r.NovaRequestID)
	if err != nil {
		return p.retryOrFail("list flavors", err, CodeNovaError)
	}
	var fl computeapi.Flavor
	if r.Kind == KindRelease {
		fl, err = computeapi.ChooseReleaseFlavor(srv.Flavor, flavors)
	} else {
		fl, err = computeapi.ChooseFlavor(srv.Flavor, flavors, r.want())
	}
	if err == nil && fl.Name == srv.Flavor.Name {
		err = fmt.Errorf("%w: the server is on flavor %s already", computeapi.ErrNoFlavor, fl.Name)
	}
	if err != nil {
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "error": err.Error()}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishFailed(ctx, tx, r, CodeNoFlavor, err.Error())
		}}
	}
	// Committed before the call: should the bridge die before recording
	// the outcome, the next attempt follows the resize under way instead
	// of calling again.
	if _, err := p.pool.Exec(ctx, `UPDATE nova_resizes SET resize_sent_at = now() WHERE request_id = $1`, r.RequestID); err != nil {
		return p.retryOrFail("record the resize call", &computeapi.Error{Op: "record", Kind: computeapi.KindRetryable, Err: err}, CodeNovaError)
	}
	if err := p.nova.Resize(ctx, srv.ID, fl.ID, r.NovaRequestID); err != nil {
		code := CodeNovaError
		return p.retryOrFail(fmt.Sprintf("resize to flavor %s (%s)", fl.Name, fl.ID), err, code)
	}
	return callOutcome{audit: map[string]any{"call": "resize", "flavor_id": fl.ID, "flavor": fl.Name, "old_flavor": srv.Flavor.Name, "server": state},
		apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.resizeCalled(ctx, tx, r, fl.ID, fl.Name, srv.Flavor.Name)
		}}
}

func (p *Path) resizeCalled(ctx context.Context, tx pgx.Tx, r resizeRow, flavorID, flavorName, oldFlavor string) (err error) {
	defer wrapErr(&err, "resize %s called", r.RequestID)
	if err := setStep(ctx, tx, r.RequestID, stepResizing, p.cfg.ResizeTimeout, false,
		", flavor_id = nullif($5,''), flavor_name = $6, old_flavor = $7, last_error = NULL", flavorID, flavorName, oldFlavor); err != nil {
		return err
	}
	to := r.RequestState
	if to == requests.Decided {
		to = requests.Dispatched
	}
	_, err = p.reqs.Transition(ctx, tx, r.RequestID, to, PhaseResizing,
		fmt.Sprintf("Nova resizes the server from flavor %s to %s (%s)", cmp.Or(oldFlavor, "?"), flavorName, r.what()), "")
	return err
}

func (p *Path) callConfirm(ctx context.Context, r resizeRow, srv computeapi.Server, state map[string]any) callOutcome {
	if r.RequestState.Final() && srv.Status == "VERIFY_RESIZE" {
		// Cancelled after the verification: undo rather than confirm.
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "the request ended before the confirm"},
			apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
				return p.startRevert(ctx, tx, r, requests.CodeCancelled, "the request ended before the resize was confirmed")
			}}
	}
	switch {
	case srv.Status == "VERIFY_RESIZE":
		if err := p.nova.ConfirmResize(ctx, srv.ID, r.NovaRequestID); err != nil {
			return p.retryOrFail("confirm resize", err, CodeNovaError)
		}
		return callOutcome{audit: map[string]any{"call": "confirm_resize", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return setStep(ctx, tx, r.RequestID, stepConfirming, p.cfg.ConfirmTimeout, false, "")
		}}
	case !srv.Resizing() && r.onTarget(srv.Flavor):
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "confirmed already"}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishSucceeded(ctx, tx, r, "the server is on the new flavor")
		}}
	case srv.Resizing():
		// resize_confirming: an earlier attempt's call is running.
		return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return setStep(ctx, tx, r.RequestID, stepConfirming, p.cfg.ConfirmTimeout, false, "")
		}}
	}
	return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
		return p.finishFailed(ctx, tx, r, CodeNovaFailed, fmt.Sprintf("cannot confirm the resize: server %s is %s (task state %s) on flavor %s%s",
			r.Instance, srv.Status, cmp.Or(srv.TaskState, "none"), srv.Flavor.Name, faultSuffix(srv.Fault)))
	}}
}

func (p *Path) callRevert(ctx context.Context, r resizeRow, srv computeapi.Server, state map[string]any) callOutcome {
	switch {
	case srv.Status == "VERIFY_RESIZE":
		if err := p.nova.RevertResize(ctx, srv.ID, r.NovaRequestID); err != nil {
			return p.retryOrFail("revert resize", err, CodeNovaError)
		}
		return callOutcome{audit: map[string]any{"call": "revert_resize", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return setStep(ctx, tx, r.RequestID, stepReverting, p.cfg.ConfirmTimeout, false, "")
		}}
	case srv.Resizing():
		return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return setStep(ctx, tx, r.RequestID, stepReverting, p.cfg.ConfirmTimeout, false, "")
		}}
	}
	return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "nothing to revert"}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
		return p.finishFailed(ctx, tx, r, cmp.Or(r.FailCode, CodeVerifyFailed),
			fmt.Sprintf("%s; the server is %s on flavor %s", r.FailReason, srv.Status, srv.Flavor.Name))
	}}
}

func faultSuffix(f string) string {
	if f == "" {
		return ""
	}
	return "; fault: " + f
}

// deadline handles one row whose step passed its deadline: it reads the
// server (a notification may have been lost) and moves on, reverts or
// fails. As for a call, the row is leased first (its deadline moves past
// the lease, committed) and the server is read with no transaction open.
func (p *Path) deadline(ctx context.Context) (_ bool, err error) {
	defer wrapErr(&err, "resize deadline")
	var lease resizeRow
	found := false
	err = p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var ok bool
		var err error
		lease, ok, err = lockResize(ctx, tx, `r.step IN ('resizing','verifying','confirming','reverting') AND r.deadline_at < now() ORDER BY r.deadline_at`, true)
		if err != nil || !ok {
			return err
		}
		found = true
		// A resize past its deadline is overdue from now on, whatever the
		// read of the server finds: a late resize_finish.end meanwhile is
		// handled as late.
		_, err = tx.Exec(ctx, `UPDATE nova_resizes SET deadline_at = now() + make_interval(secs => $2), updated_at = now(),
				overdue_at = CASE WHEN step = 'resizing' THEN coalesce(overdue_at, now()) ELSE overdue_at END
			WHERE request_id = $1`, lease.RequestID, p.cfg.CallLease.Seconds())
		return err
	})
	if err != nil || !found {
		return found, err
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallLease/2)
	srv, srvErr := p.nova.Server(cctx, lease.Instance, lease.NovaRequestID)
	cancel()
	return true, p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		r, ok, err := lockResize(ctx, tx, `r.request_id = $1`, false, lease.RequestID)
		if err != nil || !ok || r.Step != lease.Step {
			return err // a notification moved the row on meanwhile
		}
		if err := srvErr; err != nil && !computeapi.IsNotFound(err) {
			// Try again at the next look, a little later.
			_, e := tx.Exec(ctx, `UPDATE nova_resizes SET deadline_at = now() + make_interval(secs => $2), last_error = $3 WHERE request_id = $1`,
				r.RequestID, p.cfg.RetryMax.Seconds(), err.Error())
			return e
		}
		if computeapi.IsNotFound(srvErr) {
			return p.finishFailed(ctx, tx, r, pipeline.CodeNoInstance, fmt.Sprintf("Nova has no server %s any more", r.Instance))
		}
		state := fmt.Sprintf("status %s, task state %s, flavor %s%s", srv.Status, cmp.Or(srv.TaskState, "none"), srv.Flavor.Name, faultSuffix(srv.Fault))
		if err := p.auditNova(ctx, tx, r, "nova_deadline", map[string]any{"step": r.Step, "server": state}); err != nil {
			return err
		}
		switch r.Step {
		case stepResizing:
			switch {
			case srv.Status == "VERIFY_RESIZE": // finished late, or the notification was lost
				r.FlavorName = cmp.Or(r.FlavorName, srv.Flavor.Name)
				_, err := p.finished(ctx, tx, r, srv.Host)
				return err
			case srv.Resizing():
				return p.followOverdue(ctx, tx, r, fmt.Sprintf("Nova has not finished the resize to %s within %s (server: %s); the bridge follows it to its end, then %s it ([nova] on_deadline)",
					cmp.Or(r.FlavorName, "?"), p.cfg.ResizeTimeout, state, map[bool]string{true: "reverts", false: "verifies and confirms"}[p.cfg.OnDeadline == OnDeadlineRevert]))
			case r.onTarget(srv.Flavor) && r.FlavorName != "":
				r.TargetHost = srv.Host
				return p.finishSucceeded(ctx, tx, r, "the server was found on the flavor after the deadline (confirmed by someone else, or by Nova's resize_confirm_window)")
			}
			return p.finishFailed(ctx, tx, r, CodeNovaTimeout, fmt.Sprintf("Nova did not finish the resize to %s within %s and the server is no longer resizing (server: %s)",
				cmp.Or(r.FlavorName, "?"), p.cfg.ResizeTimeout, state))
		case stepVerifying:
			if err := requests.CancelUnsent(ctx, tx, r.RequestID); err != nil {
				return err
			}
			return p.startRevert(ctx, tx, r, pipeline.CodeAgentTimeout, fmt.Sprintf("the agent of host %s did not answer verify_vgpu within %s; is vgpu-agent running there and consuming %s?",
				r.TargetHost, p.cfg.VerifyTimeout, protocol.AgentQueue(r.TargetHost)))
		case stepConfirming:
			switch {
			case !srv.Resizing() && r.onTarget(srv.Flavor):
				return p.finishSucceeded(ctx, tx, r, "the server is on the new flavor (no confirm notification seen)")
			case srv.Status == "VERIFY_RESIZE": // the confirm call was lost: make it again
				return setStep(ctx, tx, r.RequestID, stepConfirm, 0, true, ", attempts = 0")
			case srv.Resizing():
				return p.followOverdue(ctx, tx, r, fmt.Sprintf("Nova has not confirmed the resize within %s (server: %s); the bridge follows it to its end",
					p.cfg.ConfirmTimeout, state))
			}
			return p.finishFailed(ctx, tx, r, CodeNovaTimeout, fmt.Sprintf("Nova did not confirm the resize within %s (server: %s)", p.cfg.ConfirmTimeout, state))
		default: // reverting
			switch {
			case srv.Status == "VERIFY_RESIZE": // the revert call was lost: make it again
				return setStep(ctx, tx, r.RequestID, stepRevert, 0, true, ", attempts = 0")
			case srv.Resizing():
				return p.followOverdue(ctx, tx, r, fmt.Sprintf("Nova has not reverted the resize within %s (server: %s); the bridge follows it to its end",
					p.cfg.ConfirmTimeout, state))
			}
			return p.finishFailed(ctx, tx, r, cmp.Or(r.FailCode, CodeVerifyFailed), r.FailReason+"; Nova reverted the resize")
		}
	})
}

// followOverdue keeps following a step Nova is still working on past its
// deadline: the server is read again every OverdueCheck, and the request
// (unless it ended) shows phase overdue with why.
func (p *Path) followOverdue(ctx context.Context, tx pgx.Tx, r resizeRow, why string) error {
	if _, err := tx.Exec(ctx, `UPDATE nova_resizes SET deadline_at = now() + make_interval(secs => $2), updated_at = now() WHERE request_id = $1`,
		r.RequestID, p.cfg.OverdueCheck.Seconds()); err != nil {
		return fmt.Errorf("follow resize %s: %w", r.RequestID, err)
	}
	if r.RequestState.Final() || r.RequestPhase == PhaseOverdue || r.RequestPhase == pipeline.PhaseCompensating {
		return nil
	}
	p.log.Warn("nova resize: past its deadline, followed to its end", logkey.RequestID, r.RequestID, logkey.Instance, r.Instance, "step", r.Step)
	_, err := p.reqs.Transition(ctx, tx, r.RequestID, r.RequestState, PhaseOverdue, why, "")
	return err
}

// DryRun is Capacity from the placement feature's dry run on its mirror.
type DryRun struct{ S *placement.Service }

// SoleType implements Capacity from the mirror's GPUs.
func (d DryRun) SoleType(trait string) (bool, error) { return soleType(d.S.Index().GPUs(), trait), nil }

// soleType reports whether there are GPUs with VGPU inventory and every
// one of them offers exactly the type trait (a GPU whose type is not
// known, with no type trait, could be any).
func soleType(gpus []engine.GPU, trait string) bool {
	n := 0
	for _, g := range gpus {
		if g.Class != nova.ResourceVGPU || g.Capacity() == 0 {
			continue
		}
		if len(g.Types) != 1 || g.Types[0] != trait {
			return false
		}
		n++
	}
	return n > 0
}

// CanFit implements Capacity.
func (d DryRun) CanFit(trait string, count int, hosts []string) (bool, error) {
	var req placement.DryRunRequest
	req.Traits.Required = []string{trait}
	req.Count, req.Limit = max(count, 1), engine.MaxLimit
	out, err := d.S.DryRun(req)
	if err != nil {
		return false, err
	}
	ok := map[string]bool{}
	for _, h := range hosts {
		ok[h] = true
	}
	for _, c := range out.Candidates {
		if !c.NeedsRetype && (ok[c.Host] || ok[c.Node]) {
			return true, nil
		}
	}
	return false, nil
}

// wrapErr prefixes a function's error with what it was doing.
func wrapErr(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf(format+": %w", append(args, *errp)...)
	}
}
