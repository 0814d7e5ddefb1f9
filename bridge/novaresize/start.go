package novaresize

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

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
// resize call the loop makes. Failures end the request (pipeline.Decisions.Fail).
func (p *Path) Act(ctx context.Context, w *pipeline.Work, s flow.Step) (err error) {
	defer wrapErr(&err, "resize through Nova")
	tx, reqID, f := w.Tx, w.Request, w.Facts
	fail := func(code, reason string) error { return p.dec.Fail(ctx, w, code, reason) }
	if p.nova == nil {
		return fail(flow.CodeNovaPath, "the Nova-native path needs Nova's API: set [nova] endpoint_override and token_file, or [openstack] cloud")
	}
	for _, o := range w.Plan.Steps {
		switch o.Kind {
		case flow.StepNotify:
			if err := p.dec.Notify(ctx, w, []flow.Step{o}); err != nil {
				return err
			}
		case flow.StepNovaResize:
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
			return fail(flow.CodeUnsupported, fmt.Sprintf("instance %s has no vGPU from its flavor to give back", f.Instance.UUID))
		}
	case policy.IntentResize:
		kind = KindResize
		if in.Count == 0 {
			n = max(f.Instance.FlavorVGPUs, 1) // a profile change keeps the count
		}
	case policy.IntentMove:
		// The flavor's vGPUs off a GPU: a cold migration, the flavor kept.
		kind, n = KindMove, f.Instance.FlavorVGPUs
		if n == 0 {
			return fail(flow.CodeUnsupported, fmt.Sprintf("instance %s has no vGPU from its flavor to move", f.Instance.UUID))
		}
	default:
		if f.Instance.FlavorVGPUs > 0 {
			return fail(flow.CodeUnsupported, fmt.Sprintf("instance %s already has %d vGPU(s) from its flavor; "+
				"a GPU_RESIZE (policy intent resize) changes them through Nova, a GPU_RELEASE gives them back", f.Instance.UUID, f.Instance.FlavorVGPUs))
		}
	}
	if len(f.Attachments) > 0 {
		// A resize rewrites the instance's allocations: the bridge's own
		// claims would have to follow (direct/move.go) while it resizes.
		return fail(flow.CodeUnsupported, fmt.Sprintf("instance %s holds %d direct-path vGPU(s); release them before a resize through Nova, or use attach_mode direct-live",
			f.Instance.UUID, len(f.Attachments)))
	}
	var busy uuid.UUID
	err = tx.QueryRow(ctx, `SELECT request_id FROM nova_resizes WHERE instance_uuid = $1 AND step <> 'done'`, f.Instance.UUID).Scan(&busy)
	switch {
	case err == nil:
		return fail(flow.CodeBusy, fmt.Sprintf("request %s is resizing this instance through Nova; retry when it is finished", busy))
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	untyped := false
	if p.capacity != nil && kind != KindRelease && kind != KindMove {
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
			return fail(flow.CodeNoCapacity, fmt.Sprintf("no GPU of a host whose agent reports has %d free unit(s) of %s (%s) in Placement; "+
				"Nova's scheduler would answer NoValidHost (or pick a host the bridge cannot verify), so Nova was not called", n, in.Profile, in.Trait))
		}
	}
	leave := ""
	switch kind {
	case KindRelease:
		in.Profile, in.TypeID, in.Trait = "", "", ""
	case KindMove:
		if len(in.GPUs) > 0 {
			leave = in.GPUs[0]
		}
	}
	// A resize under way counts in the project's usage: lock it now, and
	// stop if it moved since the decision read it.
	if err := p.dec.LockQuota(ctx, w); err != nil {
		return err
	}
	if err := requests.CreateNovaResize(ctx, tx, requests.NovaResize{Request: reqID, Instance: f.Instance.UUID, Profile: in.Profile,
		TypeID: in.TypeID, Trait: in.Trait, Count: n, SourceHost: f.Instance.Host, NovaRequestID: NovaRequestID(reqID),
		Deadline: p.cfg.ResizeTimeout + p.cfg.CallLease, Kind: string(kind), Untyped: untyped, LeaveGPU: leave}); err != nil {
		return fmt.Errorf("record the resize: %w", err)
	}
	reason := fmt.Sprintf("resize through Nova to a flavor with %d × %s", n, in.Profile)
	switch kind {
	case KindRelease:
		reason = "resize through Nova to the flavor without vGPU"
	case KindMove:
		reason = fmt.Sprintf("cold migration through Nova, the flavor kept, to move its %d vGPU(s) off GPU %s of host %s", n, cmp.Or(leave, "?"), f.Instance.Host)
	}
	if len(w.Plan.Notes) > 0 {
		reason += "; " + strings.Join(w.Plan.Notes, "; ")
	}
	if err := p.dec.Decided(ctx, w, flow.PhaseQueued, reason); err != nil {
		return err
	}
	p.kick()
	return nil
}
