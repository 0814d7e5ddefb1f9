package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/unifiedlimits"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// A decision checks its project's quota against the usage it reads. Two
// decisions of one project that read the same usage could both pass and
// together exceed the quota, so a decision that adds to the usage holds
// the project's lock from its read of the usage to its commit.
//
// Holding it from the read, as a decision's facts are loaded, serialises
// a project's decisions for the whole of their rounds, including the
// first, which only stops for the Placement claim and rolls back. In a
// burst of one project (a pool scaled up at once) that lock was most of
// what the decisions waited for. So the decision's round reads the usage
// without the lock (the Evaluate stage), and takes the lock only just
// before it writes what adds to the usage (its attachments, a Nova resize
// under way), reading the usage again: when it is what the decision was
// taken on, the decision stands, and it commits holding the lock; when it
// moved, the round runs again, this time locking before it reads. A round
// that adds nothing (a rejection, a release, a round that stops for its
// claim) never takes the lock. A rejection read without the lock is one
// taken a moment earlier: what it read had committed.

// quotaGuard is one decision's view of its project's usage (Work.quota).
type quotaGuard struct {
	eager   bool // lock before reading: the usage moved in an earlier round
	project string
	usage   policy.Usage // what the decision read
	locked  bool
	// recheck: PlanClaims locked the usage; the statement that writes
	// the plan reads it again (writePlan).
	recheck bool
	// unified is what was read of the project's unified limits before
	// the decision's transaction (Deps.Limits; nil: not read).
	unified *unifiedRead
}

// usageRead says how loadFacts reads a project's usage: under a decision's
// guard (nil: none) and, with lazy, without the lock (Evaluate's read;
// the decision locks later, in LockQuota). Other reads lock as they read.
type usageRead struct {
	guard *quotaGuard
	lazy  bool
	// limits: the snapshot gets the project's unified limits (Evaluate's
	// read, with Deps.Limits).
	limits bool
}

// lazily is Evaluate's read of the usage under g: without the lock unless
// an earlier round saw the usage move.
func (g *quotaGuard) lazily() usageRead {
	return usageRead{guard: g, lazy: g != nil && !g.eager, limits: g != nil}
}

// errQuotaMoved stops a round whose project's usage changed between its
// read and the lock: the decision runs again, locking first.
var errQuotaMoved = errors.New("the project's vGPU usage changed while the decision was taken")

// readUsage reads project's usage for a decision, locking it first
// unless ur.lazy.
func (r *factReader) readUsage(ctx context.Context, tx pgx.Tx, project string, ur usageRead) (policy.Usage, error) {
	if !ur.lazy {
		if err := lockProject(ctx, tx, project); err != nil {
			return policy.Usage{}, err
		}
	}
	u, err := r.projectUsage(ctx, tx, project)
	if err != nil {
		return u, err
	}
	r.noteUsage(ur, project, u)
	return u, nil
}

// noteUsage notes in ur's guard the usage u of project, read as ur says.
func (r *factReader) noteUsage(ur usageRead, project string, u policy.Usage) {
	g := ur.guard
	if g == nil {
		return
	}
	if g.locked && g.project != project {
		return // another project's, read for another purpose: the guard keeps the first
	}
	g.project, g.usage, g.locked = project, u, g.locked || !ur.lazy
}

func lockProject(ctx context.Context, tx pgx.Tx, project string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('vgpu-bridge/quota/' || $1, 0))`, project); err != nil {
		return fmt.Errorf("lock the usage of project %s: %w", project, err)
	}
	return nil
}

// LockQuota is called by a decision just before it writes what adds to
// its project's vGPU usage (attachments, a Nova resize under way): it
// takes the project's lock, held to the commit, and checks that the usage
// the decision was taken on has not moved meanwhile. Outside a decision,
// or once locked, it does nothing.
func (d Decisions) LockQuota(ctx context.Context, w *Work) error {
	g := w.quota
	if g != nil && g.unified != nil && g.unified.err != nil && g.unified.project == g.project {
		// The unified limits could not be read: what adds waits.
		return g.unified.err
	}
	if g == nil || g.locked || g.project == "" {
		return nil
	}
	if err := lockProject(ctx, w.Tx, g.project); err != nil {
		return err
	}
	g.locked = true
	u, err := d.facts.projectUsage(ctx, w.Tx, g.project)
	if err != nil {
		return err
	}
	if u != g.usage {
		return errQuotaMoved
	}
	return nil
}

// With [quota] driver = unified_limits (Deps.Limits), a decision is also
// checked against the project's Keystone unified limits (package
// unifiedlimits): "class:VGPU", the limit Nova enforces on flavors, and
// the bridge's "vgpu:<profile>" limits. Their usage is read outside the
// decision's transaction (no Placement or Keystone call runs inside one):
// the limits (cached), then Placement's VGPU usage of the project, as
// Nova counts class:VGPU (nova.limit.placement._get_usage). Placement
// holds the direct path's claims too: they live in the instance's
// consumer. What Placement does not hold yet is added in the transaction:
// the vGPUs decisions planned and are claiming (planned_claims), and the
// direct-path vGPUs recorded since Placement was read (a decision that
// claimed and recorded between the read and this one). A claim made but
// not yet recorded counts twice for that moment: the count errs high,
// never low. Per-profile usage is the bridge's own count of the profile
// (direct-path, planned, Nova resizes under way, flavors whose profile is
// known): Nova 26 counts no vGPU type.

// LimitSource is what the pipeline reads of Keystone's unified limits and
// Placement's usage (unifiedlimits.Source).
type LimitSource interface {
	Limits(ctx context.Context, project string) ([]unifiedlimits.Limit, error)
	PlacementVGPUs(ctx context.Context, project string) (int, error)
}

// unifiedRead is one read of a project's unified limits and usage,
// before a decision's transaction.
type unifiedRead struct {
	project   string
	limits    []unifiedlimits.Limit
	placement int // Placement's VGPU usage of the project
	attached  int // the bridge's direct-path vGPUs of the project just before Placement was read
	// err is why Keystone or Placement could not be read (an errRetry):
	// the policy runs without the unified limits, and a decision that
	// adds vGPUs stops at LockQuota with it, to be tried again; one that
	// adds nothing (a release) goes on.
	err error
}

// errNeedLimits stops a decision whose project's unified limits were not
// read before its transaction (its project was not known then):
// decideLocked reads them and decides again.
type errNeedLimits struct{ project string }

func (e errNeedLimits) Error() string {
	return fmt.Sprintf("the unified limits of project %s are read before the decision", e.project)
}

// readUnified reads project's unified limits and usage, with no
// transaction open on q. When Keystone or Placement cannot be read, r.err
// says why (unifiedlimits.ErrUnavailable, as an errRetry): a decision that
// adds vGPUs waits and is tried again (LockQuota), never decided as if the
// project had no limit.
func (r *factReader) readUnified(ctx context.Context, q Querier, project string) (*unifiedRead, error) {
	u := &unifiedRead{project: project}
	var err error
	if u.limits, err = r.limits.Limits(ctx, project); err != nil {
		u.err = errRetry{err}
		return u, nil
	}
	if u.attached, _, err = bridgeVGPUs(ctx, q, project); err != nil {
		return nil, err
	}
	if u.placement, err = r.limits.PlacementVGPUs(ctx, project); err != nil {
		u.err = errRetry{err}
	}
	return u, nil
}

// readUnifiedOf is readUnified of project, else of instance's project as
// the bridge knows it; nil when neither is known (the decision asks with
// errNeedLimits once it knows).
func (r *factReader) readUnifiedOf(ctx context.Context, q Querier, project, instance string) (*unifiedRead, error) {
	if project == "" && instance != "" {
		err := q.QueryRow(ctx, `SELECT coalesce(project_id,'') FROM instances WHERE uuid = $1`, instance).Scan(&project)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read the project of %s: %w", instance, err)
		}
	}
	if project == "" {
		return nil, nil
	}
	return r.readUnified(ctx, q, project)
}

// bridgeVGPUs counts the project's direct-path vGPUs (pending,
// attached, or held off a forced-down host) and the vGPUs its open decisions planned to claim.
func bridgeVGPUs(ctx context.Context, q Querier, project string) (attached, planned int, err error) {
	err = q.QueryRow(ctx, `SELECT
			coalesce((SELECT sum(a.amount) FROM vgpu_attachments a JOIN instances i ON i.uuid = a.instance_uuid
				WHERE i.project_id = $1 AND (a.state IN ('pending','attached') OR (a.state = 'held' AND a.provider_uuid IS NOT NULL))), 0)::int,
			coalesce((SELECT sum(c.units) FROM planned_claims c JOIN instances i ON i.uuid = c.instance_uuid
				JOIN events e ON e.id = c.event_id AND e.processed_at IS NULL WHERE i.project_id = $1), 0)::int`, project).
		Scan(&attached, &planned)
	if err != nil {
		return 0, 0, fmt.Errorf("read the direct-path vGPUs of project %s: %w", project, err)
	}
	return attached, planned, nil
}

// projectLimits is the project's unified limits with their usage, for
// the policy (policy.LimitState), in the decision's transaction; nil
// without Deps.Limits. It needs the read decideLocked made before the
// transaction (errNeedLimits when there is none for project).
func (r *factReader) projectLimits(ctx context.Context, tx pgx.Tx, project string, g *quotaGuard) ([]policy.UnifiedLimit, error) {
	if r.limits == nil {
		return nil, nil
	}
	if g == nil || g.unified == nil || g.unified.project != project {
		return nil, errNeedLimits{project}
	}
	if g.unified.err != nil {
		return nil, nil // LockQuota stops a decision that adds
	}
	return r.limitsFrom(ctx, tx, g.unified)
}

// limitsFrom completes r, read before, with what q reads now.
func (r *factReader) limitsFrom(ctx context.Context, q Querier, u *unifiedRead) ([]policy.UnifiedLimit, error) {
	project := u.project
	attached, planned, err := bridgeVGPUs(ctx, q, project)
	if err != nil {
		return nil, err
	}
	var byProfile map[string]int
	out := make([]policy.UnifiedLimit, 0, len(u.limits))
	for _, l := range u.limits {
		ul := policy.UnifiedLimit{Resource: l.Resource, Profile: l.Profile, Limit: l.Limit}
		if l.Profile == "" {
			ul.Usage = u.placement + planned + max(0, attached-u.attached)
		} else {
			if byProfile == nil {
				if byProfile, err = r.profileUsage(ctx, q, project); err != nil {
					return nil, err
				}
			}
			ul.Usage = byProfile[l.Profile]
		}
		out = append(out, ul)
	}
	return out, nil
}

// profileUsage is the bridge's count of the project's vGPUs by profile:
// direct-path (pending or attached), planned, Nova resizes under way,
// flavors' vGPUs whose request group requires a profile's trait, and the
// VFs of Nova-owned VF GPUs flavors ask for by alias (novaVFUsage).
func (r *factReader) profileUsage(ctx context.Context, q Querier, project string) (map[string]int, error) {
	rows, err := q.Query(ctx, bridgeVGPUsByProfile+`
		SELECT '', 0, vgpu_demand FROM instances
			WHERE project_id = $1 AND deleted_at IS NULL AND vgpus > 0 AND vgpu_demand IS NOT NULL`, project)
	if err != nil {
		return nil, fmt.Errorf("read the usage by profile of project %s: %w", project, err)
	}
	out := map[string]int{}
	var prof string
	var n int
	var demand []byte
	_, err = pgx.ForEachRow(rows, []any{&prof, &n, &demand}, func() error {
		if demand == nil {
			out[prof] += n
			return nil
		}
		var d nova.Demand
		if r.catalog == nil || json.Unmarshal(demand, &d) != nil {
			return nil
		}
		for _, g := range d.Groups {
			for _, tr := range g.Required {
				if cp, ok := r.catalog.ByTrait(tr); ok {
					out[cp.Name] += g.Resources[nova.ResourceVGPU]
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the usage by profile of project %s: %w", project, err)
	}
	vfs, err := r.novaVFUsage(ctx, q, project)
	if err != nil {
		return nil, err
	}
	for _, v := range vfs {
		if v.Profile != "" {
			out[v.Profile] += v.Amount
		}
	}
	return out, nil
}

// novaVFUsage are the VFs of Nova-owned VF GPUs the project's instances
// hold by their flavors' pci_passthrough:alias (novaVFs; none without
// [placement] nova_vf_aliases): every instance not deleted, as flavors'
// vGPUs count. Nova 26 counts PCI devices in no quota (neither its
// unified limits nor class:VGPU, which is Placement's VGPU class), so the
// bridge's own quota is the only one that sees them.
func (r *factReader) novaVFUsage(ctx context.Context, q Querier, project string) ([]requests.FlavorVGPU, error) {
	if len(r.aliases) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT flavor->'extra_specs'->>'`+novaAliasSpec+`' FROM instances
		WHERE project_id = $1 AND deleted_at IS NULL AND coalesce(vm_state,'') <> 'deleted'
			AND flavor->'extra_specs' ? '`+novaAliasSpec+`'`, project)
	if err != nil {
		return nil, fmt.Errorf("read the Nova-owned VFs of project %s: %w", project, err)
	}
	var out []requests.FlavorVGPU
	var spec string
	_, err = pgx.ForEachRow(rows, []any{&spec}, func() error {
		out = append(out, novaVFs(r.catalog, r.aliases, spec)...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the Nova-owned VFs of project %s: %w", project, err)
	}
	return out, nil
}

// QuotaView is a project's limits and usage as the bridge sees them
// (GET /v1/quota, vgpuctl quota show).
type QuotaView struct {
	ProjectID string `json:"project_id"`
	// Driver is [quota] driver: "bridge" or "unified_limits".
	Driver string `json:"driver"`
	// VGPUs and FramebufferMiB are the bridge's own count of the project's
	// vGPUs (direct-path, planned, Nova resizes under way, flavors, VFs of
	// Nova-owned VF GPUs asked for by alias), which
	// the policy file's quota is checked against.
	VGPUs          int `json:"vgpus"`
	FramebufferMiB int `json:"framebuffer_mib"`
	// Policy is the policy file's quota of the project (0: unlimited).
	Policy PolicyQuota `json:"policy"`
	// Limits are Keystone's unified limits with their usage as the
	// bridge counts it for them; empty with driver = bridge.
	Limits []QuotaLimit `json:"limits"`
}

// PolicyQuota is the policy file's effective quota of a project.
type PolicyQuota struct {
	MaxVGPUs          int      `json:"max_vgpus"`
	MaxFramebufferGiB int      `json:"max_framebuffer_gib"`
	MaxVGPUsPerVM     int      `json:"max_vgpus_per_vm"`
	AllowedProfiles   []string `json:"allowed_profiles"`
}

// QuotaLimit is one unified limit of a project with its usage.
type QuotaLimit struct {
	Resource string `json:"resource"`
	Profile  string `json:"profile,omitempty"`
	Limit    int    `json:"limit"`
	Usage    int    `json:"usage"`
	Origin   string `json:"origin"`
}

// ErrLimitsUnavailable wraps a QuotaView that could not read Keystone or
// Placement.
var ErrLimitsUnavailable = unifiedlimits.ErrUnavailable

// Quota reads project's QuotaView, outside any transaction.
func (p *Processor) Quota(ctx context.Context, project string) (QuotaView, error) {
	v := QuotaView{ProjectID: project, Driver: "bridge", Limits: []QuotaLimit{}}
	u, err := p.facts.projectUsage(ctx, p.d.Pool, project)
	if err != nil {
		return v, err
	}
	v.VGPUs, v.FramebufferMiB = u.VGPUs, u.FramebufferMiB
	if pol := p.d.Policy.Policy(); pol != nil {
		q := pol.ProjectQuota(project)
		deref := func(n *int) int {
			if n == nil {
				return 0
			}
			return *n
		}
		v.Policy = PolicyQuota{MaxVGPUs: deref(q.MaxVGPUs), MaxFramebufferGiB: deref(q.MaxFramebufferGiB),
			MaxVGPUsPerVM: deref(q.MaxVGPUsPerVM), AllowedProfiles: q.AllowedProfiles}
	}
	if v.Policy.AllowedProfiles == nil {
		v.Policy.AllowedProfiles = []string{}
	}
	if p.d.Limits == nil {
		return v, nil
	}
	v.Driver = "unified_limits"
	r, err := p.facts.readUnified(ctx, p.d.Pool, project)
	if err == nil {
		err = r.err
	}
	if err != nil {
		return v, err
	}
	ls, err := p.facts.limitsFrom(ctx, p.d.Pool, r)
	if err != nil {
		return v, err
	}
	for i, l := range ls {
		v.Limits = append(v.Limits, QuotaLimit{Resource: l.Resource, Profile: l.Profile, Limit: l.Limit, Usage: l.Usage, Origin: r.limits[i].Origin})
	}
	return v, nil
}
