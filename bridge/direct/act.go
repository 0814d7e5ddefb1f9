package direct

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// ActPlan runs an OutcomeAct plan: claims, attachment rows, commands and the
// request's transition to decided. A claim that cannot be made turns the
// plan into a failure (plan.Outcome is set to OutcomeFail) after the claims
// already made are released.
//
// In the decision's transaction, a plan that attaches is only planned: its
// vGPUs are committed as planned claims (requests.PlanClaims, after
// LockQuota) and the act waits for them (Work.WaitForClaims); the pipeline
// claims (Claim), and ActPlan runs again in the second transaction (apply) with the claims made.
func (p *Path) ActPlan(ctx context.Context, w *pipeline.Work, reqID uuid.UUID, state requests.State, plan *flow.Plan, f pipeline.Facts) error {
	tx := w.Tx
	if !w.Applying() {
		var planned []requests.PlannedClaim
		for _, s := range plan.Steps {
			if s.Kind == flow.StepAttach {
				planned = append(planned, requests.PlannedClaim{Profile: s.Intent.Profile, Units: max(s.Intent.Count, 1)})
			}
		}
		if len(planned) > 0 {
			// New vGPUs add to the project's usage: lock it now; the
			// statement that commits the plan stops if it moved since
			// the decision read it.
			if err := p.dec.PlanClaims(ctx, w, reqID, f.Instance.UUID, planned); err != nil {
				return err
			}
			w.WaitForClaims(reqID, *plan, f)
			return nil
		}
	}
	now := time.Now()
	deadline := now.Add(p.cfg.RequestTimeout)
	seq := w.LastSeq() // read with the request's state (apply)
	if !w.Applying() {
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1`, reqID).Scan(&seq); err != nil {
			return err
		}
	}
	var claims []pipeline.Claim
	var cmds []outCmd
	var atts []flow.Attachment
	var release []flow.Attachment
	var summary []string
	restored := 0 // held vGPUs claimed again (Step.Reclaim)
	// fail gives the claims made back and turns the plan into a failure.
	fail := func(code, reason string) error {
		w.GiveBackClaims() // released after the transaction
		if err := p.auditReleased(ctx, tx, reqID, claims, reason); err != nil {
			return err
		}
		plan.Outcome, plan.Code, plan.Reason, plan.Steps = flow.OutcomeFail, code, reason, nil
		return p.dec.Close(ctx, w, reqID, state, *plan)
	}
	vfs := vfPicker{tx: tx}
	for _, s := range plan.Steps {
		switch s.Kind {
		case flow.StepAttach:
			if s.Reclaim != nil {
				// A vGPU held off its host, its claim made again on its GPU:
				// its mdev is there, nothing goes to the agent.
				made, err := w.NextClaim()
				claims = append(claims, made...)
				a := *s.Reclaim
				// kept: a vGPU kept on the source of a cold migration that
				// Nova reverted (move.go); its claim came back with Nova's
				// revert of the allocations and is adopted.
				kept := a.State == flow.AttKept
				if err != nil {
					if errors.Is(err, pipeline.ErrNoCapacity) || errors.Is(err, pipeline.ErrNoAddress) {
						what := fmt.Sprintf("vGPU %s (mdev %s) held off host %s cannot be claimed again on its GPU %s: %v; "+
							"it stays held (its mdev is still on the host)", a.Profile, a.ID, a.Host, a.PCIAddress, err)
						if kept {
							what = fmt.Sprintf("vGPU %s (mdev %s) kept on host %s for the revert of a migration cannot be claimed again on its GPU %s: %v; "+
								"it stays kept (its mdev is still in the guest)", a.Profile, a.ID, a.Host, a.PCIAddress, err)
						}
						return fail(flow.CodeNoCapacity, what)
					}
					return pipeline.Retry(fmt.Errorf("claim again %d × %s on GPU %s: %w", max(a.Amount, 1), a.Profile, a.Provider, err))
				}
				held := a.HeldAfter
				for _, mc := range made {
					held = mc.Held
				}
				why, did := "claimed again on its GPU: the host is back and the instance was not evacuated", "the host is back"
				if kept {
					why, did = "attached again: Nova reverted the migration to the source, where the guest kept its mdev", "the migration was reverted"
				}
				if err := requests.Restore(ctx, tx, a.ID, held, why); err != nil {
					return err
				}
				restored++
				summary = append(summary, fmt.Sprintf("claim %s (mdev %s) again on %s GPU %s: %s", a.Profile, a.ID, a.Host, a.PCIAddress, did))
				continue
			}
			made, err := w.NextClaim()
			claims = append(claims, made...)
			if err != nil {
				if errors.Is(err, pipeline.ErrNoCapacity) || errors.Is(err, pipeline.ErrNoAddress) {
					code := flow.CodeNoCapacity
					if errors.Is(err, pipeline.ErrNoAddress) {
						code = flow.CodePlacement
					}
					reason := fmt.Sprintf("no GPU of host %s (node %s) can take %d × %s (%s): %v", f.Instance.Host, f.Instance.Node,
						max(s.Intent.Count, 1), s.Intent.Profile, s.Intent.Trait, err)
					if s.Intent.Kind == policy.IntentMove {
						reason = fmt.Sprintf("move off GPU %s: no other GPU of host %s (node %s) can take %d × %s (%s); the vGPU stays where it is: %v",
							strings.Join(s.Intent.GPUs, ","), f.Instance.Host, f.Instance.Node, max(s.Intent.Count, 1), s.Intent.Profile, s.Intent.Trait, err)
					}
					return fail(code, reason)
				}
				return pipeline.Retry(fmt.Errorf("claim %d × %s on node %s: %w", max(s.Intent.Count, 1), s.Intent.Profile, f.Instance.Node, err))
			}
			for _, mc := range made {
				a := flow.Attachment{ID: uuid.New(), InstanceUUID: f.Instance.UUID, RequestID: reqID, Host: f.Instance.Host, Node: f.Instance.Node,
					Provider: mc.Provider, Class: mc.Class, Amount: 1, HeldAfter: mc.Held, PCIAddress: p.d.Placement.GPUAddress(mc.Provider),
					TypeID: s.Intent.TypeID, Profile: s.Intent.Profile, Trait: s.Intent.Trait, Mode: s.Mode, State: flow.AttPending,
					FrameRateLimit: s.Intent.FrameRateLimit}
				// One vGPU a unit; on a mixed GPU, its type's framebuffer (MiB).
				vgpus, per := mc.Amount, 1
				if mc.Class == placement.BridgeFBClass {
					vgpus = max(s.Intent.Count, 1)
					per = mc.Amount / vgpus
					a.Units = per
				}
				for u := 0; u < vgpus; u++ {
					b := a
					if u > 0 {
						b.ID = uuid.New()
					}
					b.HeldAfter = mc.Held - per*(vgpus-1-u)
					if IsVF(b) {
						// A bridge-owned VF GPU: the vGPU is one of its free VFs.
						vf, err := vfs.pick(ctx, b.Host, a.PCIAddress)
						if errors.Is(err, errNoFreeVF) {
							return fail(flow.CodeNoCapacity, fmt.Sprintf("GPU %s of host %s can take %s by Placement, but %v", a.PCIAddress, b.Host, s.Intent.Profile, err))
						}
						if err != nil {
							return err
						}
						b.PCIAddress = vf
					}
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
				on := ""
				if IsVF(a) {
					on = " (VF " + atts[len(atts)-1].PCIAddress + ")"
				}
				summary = append(summary, fmt.Sprintf("attach %d × %s on %s GPU %s%s%s", vgpus, s.Intent.Profile, f.Instance.Host, a.PCIAddress, on, frl))
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
				dev := "mdev " + a.ID.String()
				if IsVF(a) {
					dev = "VF " + a.PCIAddress
				}
				summary = append(summary, fmt.Sprintf("release %s (%s) on %s", a.Profile, dev, a.Host))
			}
		case flow.StepReattach:
			for _, a := range s.Release {
				c, err := pipeline.NewCommand(protocol.AttachVGPU, a.Host, reqID.String(), a.InstanceUUID,
					attachParams(a, pipeline.AgentMode(policy.ModeDirectLive, f.Instance.VMState)),
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
			c, err := pipeline.NewCommand(s.Command, s.Host, reqID.String(), f.Instance.UUID, s.Params, now, deadline)
			if err != nil {
				plan.Notes = append(plan.Notes, fmt.Sprintf("%s: %v", s.Command, err))
				continue
			}
			seq++
			cmds = append(cmds, outCmd{c: c, seq: seq})
			summary = append(summary, string(s.Command))
		case flow.StepNotify:
			if err := pipeline.RecordNotify(ctx, tx, p.actor(), reqID, f.Instance.UUID, []flow.Step{s}); err != nil {
				return err
			}
		}
	}
	// New vGPUs were in the project's usage as planned since the first
	// transaction: the record takes their place (apply drops the plan).
	// The releases begin first: the attachments and commands go in one
	// statement with the request's move (ActDecided).
	for _, a := range release {
		if err := requests.BeginRelease(ctx, tx, a.ID, reqID); err != nil {
			return err
		}
	}
	// vGPUs with their commands are recorded with the request's move to
	// decided, in one statement (ActDecided).
	withMove := len(atts) > 0 && len(cmds) > 0
	if !withMove {
		if err := requests.AddAttachments(ctx, tx, reqID, atts); err != nil {
			return err
		}
		if err := insertCommands(ctx, tx, reqID, requests.PurposeAction, cmds); err != nil {
			return err
		}
	}
	if len(cmds) == 0 && restored > 0 {
		// Held vGPUs claimed again: done, nothing for the agents.
		return p.succeed(ctx, tx, reqID, state, flow.PhaseApplying, joinNonEmpty("; ", summary...))
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
		return p.dec.Close(ctx, w, reqID, state, *plan)
	}
	reason := joinNonEmpty("; ", summary...)
	if withMove {
		rows, err := commandRows(reqID, cmds)
		if err != nil {
			return err
		}
		if _, err := p.d.Requests.ActDecided(ctx, tx, reqID, pipeline.NextState(state, requests.Decided), "queued", reason, deadline,
			atts, requests.PurposeAction, rows, w.NotesLater()); err != nil {
			return err
		}
	} else if _, err := p.d.Requests.TransitionUntil(ctx, tx, reqID, pipeline.NextState(state, requests.Decided), "queued", reason, "", deadline); err != nil {
		return err
	}
	p.count.Claimed(len(atts))
	return nil
}

// Claim claims the units of an attach step, or adopts units an
// interrupted earlier attempt claimed for this consumer but recorded
// nowhere.
func (p *Path) Claim(ctx context.Context, reqID uuid.UUID, f pipeline.Facts, s flow.Step, planned []flow.Attachment) ([]pipeline.Claim, error) {
	if s.Reclaim != nil {
		return p.reclaim(ctx, f, *s.Reclaim, planned)
	}
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
				// Units of vGPUs the bridge gave back and has not yet
				// released in Placement (planned_releases) are no crash's
				// leftovers: their release takes them.
				pending, err := requests.ReleasesPending(ctx, p.d.Pool, f.Instance.UUID)
				if err != nil {
					return nil, err
				}
				if pending {
					break
				}
				p.log.Info("pipeline: adopting a claim an interrupted attempt made", logkey.Instance, f.Instance.UUID, "provider", h.Provider, "units", n)
				return []pipeline.Claim{{Consumer: f.Instance.UUID, Provider: h.Provider, Class: h.Class, Amount: n, Held: h.Amount}}, nil
			}
		}
	}
	spec := pipeline.ClaimSpec{Consumer: f.Instance.UUID, ProjectID: f.Instance.ProjectID, UserID: f.Instance.UserID,
		Node: f.Instance.Node, Trait: s.Intent.Trait, Count: n, Read: read, Exclude: s.Exclude}
	cl, err := p.d.Placement.Claim(ctx, spec)
	if errors.Is(err, pipeline.ErrNoCapacity) {
		cl, err = p.mixedClaim(ctx, f, spec, err)
	}
	if errors.Is(err, pipeline.ErrNoCapacity) {
		cl, err = p.retypeAndClaim(ctx, reqID, f, s, spec, err)
	}
	if err != nil {
		return nil, err
	}
	mc := pipeline.Claim{Consumer: f.Instance.UUID, Provider: cl.Provider, Class: cl.Class, Amount: cl.Amount, Held: cl.Held}
	if p.d.Placement.GPUAddress(cl.Provider) == "" {
		return []pipeline.Claim{mc}, fmt.Errorf("%w: provider %s", pipeline.ErrNoAddress, cl.Provider)
	}
	return []pipeline.Claim{mc}, nil
}

// mixedClaim is what a claim that found no GPU of its type with room
// (noCap) tries next: the type's framebuffer on a mixed bridge-owned GPU
// of the instance's host ([placement] bridge_owned_gpus =
// HOST/PF=mixed), Placement checking that it fits. A host with no mixed
// GPU keeps noCap as it is.
func (p *Path) mixedClaim(ctx context.Context, f pipeline.Facts, spec pipeline.ClaimSpec, noCap error) (pipeline.Claimed, error) {
	mc, ok := p.d.Placement.(pipeline.MixedClaimer)
	if !ok {
		return pipeline.Claimed{}, noCap
	}
	cl, err := mc.ClaimMixed(ctx, f.Instance.Host, spec)
	switch {
	case errors.Is(err, placement.ErrNoMixedGPUs):
		return pipeline.Claimed{}, noCap
	case errors.Is(err, pipeline.ErrNoCapacity):
		return pipeline.Claimed{}, fmt.Errorf("%w; mixed GPUs: %v", noCap, err)
	}
	return cl, err
}

// retypeAndClaim is what a claim that found no capacity (noCap) does
// when Placement re-types bridge-owned GPUs on demand (pipeline.Retyper,
// [placement] retype_on_demand): an empty bridge-owned GPU of the
// instance's host is re-typed to the step's type (placement.Service.
// Retype: withdrawn, recorded, published; no window where Placement offers
// a type the host cannot create), the re-type is audited (gpu.retype,
// with the request), and the units are claimed there. It runs between the
// decision's transactions, with none open, as every claim does.
//
// No GPU to re-type keeps noCap (ErrNoCapacity, with why none qualified);
// a claim that landed on the GPU while it was re-typed undid the re-type
// (ErrNoCapacity, saying so); units of the re-typed GPU taken before this
// claim are ErrNoCapacity too. A re-type interrupted otherwise (Placement
// away) is an error that retries the event: the retry, or the next
// publication of the bridge-owned GPUs, finishes it.
func (p *Path) retypeAndClaim(ctx context.Context, reqID uuid.UUID, f pipeline.Facts, s flow.Step, spec pipeline.ClaimSpec, noCap error) (pipeline.Claimed, error) {
	rt, ok := p.d.Placement.(pipeline.Retyper)
	if !ok {
		return pipeline.Claimed{}, noCap
	}
	r, err := rt.RetypeFor(ctx, pipeline.RetypeSpec{Host: f.Instance.Host, Trait: spec.Trait, Count: spec.Count, Exclude: spec.Exclude})
	switch {
	case errors.Is(err, pipeline.ErrNoOwnedGPUs):
		return pipeline.Claimed{}, noCap // nothing of the host is the bridge's to re-type
	case errors.Is(err, pipeline.ErrNoRetype):
		return pipeline.Claimed{}, fmt.Errorf("%w; re-type on demand: %v", noCap, err)
	case errors.Is(err, pipeline.ErrNoCapacity):
		return pipeline.Claimed{}, fmt.Errorf("%w; re-type on demand: %v", noCap, err)
	case err != nil:
		return pipeline.Claimed{}, fmt.Errorf("re-type on demand for %s on host %s: %w", spec.Trait, f.Instance.Host, err)
	}
	p.log.Info("pipeline: GPU re-typed on demand", logkey.Instance, f.Instance.UUID, logkey.Host, r.Host, "pci", r.PCI, "from", r.From, "to", r.To,
		"request", reqID)
	why := fmt.Sprintf("request %s: no free %s on host %s for %d × %s of instance %s", reqID, spec.Trait, f.Instance.Host, spec.Count,
		s.Intent.Profile, f.Instance.UUID)
	if err := requests.Audit(ctx, p.d.Pool, requests.Entry{Actor: p.actor(), Action: "gpu.retype", ObjectType: "gpu",
		ObjectID: r.Host + "/" + r.PCI, RequestID: reqID.String(),
		Detail: map[string]string{"from": r.From, "to": r.To, "provider": r.Provider, "reason": why}}); err != nil {
		// The re-type is made: the claim goes on, the audit row is missed.
		p.log.Error("pipeline: re-type on demand not audited", logkey.Host, r.Host, "pci", r.PCI, logkey.Err, err)
	}
	spec.Provider = r.Provider
	cl, err := p.d.Placement.Claim(ctx, spec)
	if errors.Is(err, pipeline.ErrNoCapacity) {
		return pipeline.Claimed{}, fmt.Errorf("%w; GPU %s of host %s was re-typed %s → %s for this request and its units were taken meanwhile: %v",
			pipeline.ErrNoCapacity, r.PCI, r.Host, r.From, r.To, err)
	}
	return cl, err
}

// reclaim claims again the units of a, a vGPU held off its host, on its
// own GPU; or adopts them where an interrupted attempt claimed them
// already. planned are the units the same act claimed before it. While
// the hold's release is still to be made in Placement it waits (an error
// other than ErrNoCapacity: the event is tried again).
func (p *Path) reclaim(ctx context.Context, f pipeline.Facts, a flow.Attachment, planned []flow.Attachment) ([]pipeline.Claim, error) {
	n := max(a.Amount, 1)
	pending, err := requests.ReleasesPending(ctx, p.d.Pool, f.Instance.UUID)
	if err != nil {
		return nil, err
	}
	if pending {
		return nil, fmt.Errorf("the release of the claims of %s held off host %s is not made yet", f.Instance.UUID, a.Host)
	}
	holdings, read, err := p.d.Placement.CachedHoldings(ctx, f.Instance.UUID)
	if err != nil {
		return nil, err
	}
	known := 0
	for _, b := range f.Attachments {
		if b.Provider == a.Provider && b.State != flow.AttFailed && b.State != flow.AttReleased {
			known += b.Amount
		}
	}
	for _, b := range planned {
		if b.Provider == a.Provider {
			known += b.Amount
		}
	}
	for _, h := range holdings {
		if h.Provider == a.Provider && h.Amount-known >= n {
			p.log.Info("pipeline: adopting a claim an interrupted attempt made again", logkey.Instance, f.Instance.UUID, "provider", h.Provider, "units", n)
			return []pipeline.Claim{{Consumer: f.Instance.UUID, Provider: h.Provider, Class: h.Class, Amount: n, Held: h.Amount}}, nil
		}
	}
	cl, err := p.d.Placement.Claim(ctx, pipeline.ClaimSpec{Consumer: f.Instance.UUID, ProjectID: f.Instance.ProjectID, UserID: f.Instance.UserID,
		Node: a.Node, Trait: a.Trait, Count: n, Read: read, Provider: a.Provider})
	if err != nil {
		return nil, err
	}
	return []pipeline.Claim{{Consumer: f.Instance.UUID, Provider: cl.Provider, Class: cl.Class, Amount: cl.Amount, Held: cl.Held}}, nil
}

// ReleaseClaims gives back claims made for a decision that did not
// happen; errors are logged (the drift reconciler finds what is left).
func (p *Path) ReleaseClaims(ctx context.Context, claims []pipeline.Claim, why string) {
	ctx = context.WithoutCancel(ctx)
	for _, c := range claims {
		if err := p.d.Placement.ReleaseUnits(ctx, c.Consumer, c.Provider, c.Class, c.Amount, c.Held); err != nil {
			p.log.Error("pipeline: cannot release a claim; Placement keeps it until the reconciler repairs it",
				logkey.Instance, c.Consumer, "provider", c.Provider, logkey.Err, err, logkey.Reason, why)
			continue
		}
		p.count.Compensated("claim_released")
	}
}

func (p *Path) auditReleased(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, claims []pipeline.Claim, why string) error {
	for _, c := range claims {
		detail, _ := json.Marshal(map[string]any{"claim_released": map[string]any{"provider": c.Provider, "class": c.Class, "amount": c.Amount},
			"reason": why})
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "compensate", ObjectType: "instance",
			ObjectID: c.Consumer, RequestID: reqID.String(), Detail: detail}); err != nil {
			return err
		}
	}
	return nil
}
