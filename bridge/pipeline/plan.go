package pipeline

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// InstanceFacts is what the bridge knows of the event's instance.
type InstanceFacts struct {
	UUID      string
	ProjectID string
	UserID    string
	Host      string
	Node      string
	VMState   string
	// FlavorVGPUs are the units of the instance's flavor (Nova's own).
	FlavorVGPUs int
	Known       bool // a row exists in instances
	Deleted     bool
	// Absent is true when the instance is not Known and Nova's API, asked
	// for it during this decision (Deps.Lookup), has no such server.
	Absent bool
}

// Facts are the inputs of planning besides the decision.
type Facts struct {
	Instance    InstanceFacts
	Attachments []flow.Attachment // the instance's active ones (pending, attached, releasing)
	// LastReport is when the instance's host last reported; zero when it
	// never did (such a host is not held stale).
	LastReport time.Time
	Now        time.Time
	StaleAge   time.Duration
	// Deleting is true for the event that says the instance is gone
	// (instance.delete.end): its domain no longer exists.
	Deleting bool
	// Rebuilt is true for events after which Nova has rebuilt the domain
	// from its own definition (reboot, power on, unshelve): the direct-path
	// vGPUs, unknown to Nova, must be attached again.
	Rebuilt bool
}

// RebuildEvents are the Nova event types after which the bridge attaches
// its direct-path vGPUs again. instance.rebuild.end counts when the
// instance stayed on its host; on another host (an evacuation) it is a
// move (MoveEvents, move.go).
var RebuildEvents = []string{"instance.reboot.end", "instance.power_on.end", "instance.unshelve.end", "instance.rebuild.end"}

// flavorVGPUs marks, in PlanDecision's busy set, the vGPUs of the
// instance's flavor as taken by a Nova-path step.
const flavorVGPUs = "flavor"

// PlanDecision turns a policy decision into steps. It is pure.
func PlanDecision(d *policy.Decision, f Facts) flow.Plan {
	if len(d.Held) > 0 && !d.Fired() {
		// Held back, nothing else decided: evaluated again when the hold
		// ends (defer.go).
		return flow.Plan{Outcome: flow.OutcomeDefer, Reason: deferReason(d)}
	}
	if d.Rejected {
		if d.Code == policy.RefusalQuota {
			return flow.Plan{Outcome: flow.OutcomeReject, Code: flow.CodeQuota, Reason: d.Reason}
		}
		return flow.Plan{Outcome: flow.OutcomeReject, Code: flow.CodePolicyRejected, Reason: d.Reason}
	}
	var p flow.Plan
	fail := func(code, reason string) flow.Plan {
		return flow.Plan{Outcome: flow.OutcomeFail, Code: code, Reason: reason}
	}
	busy := map[string]bool{} // attachments already taken by a release step
	for _, in := range d.Intents {
		switch in.Kind {
		case policy.IntentAttach:
			if in.Mode != policy.ModeDirectLive && in.Mode != policy.ModeDirectCold {
				// The Nova-native path (package novaresize): Nova chooses the host.
				if why, code := novaHostProblem(f); why != "" {
					return fail(code, why)
				}
				if in.Trait == "" {
					return fail(flow.CodeUnsupported, fmt.Sprintf("profile %s has no known vGPU type (no agent reported it and the profile seed names no type id)", in.Profile))
				}
				p.Steps = append(p.Steps, flow.Step{Kind: flow.StepNovaResize, Intent: in, Host: f.Instance.Host})
				p.Notes = append(p.Notes, frameRateNote(in)...)
				continue
			}
			if why, code := hostProblem(f); why != "" {
				return fail(code, why)
			}
			if in.Trait == "" {
				return fail(flow.CodeUnsupported, fmt.Sprintf("profile %s has no known vGPU type (no agent reported it and the profile seed names no type id)", in.Profile))
			}
			p.Steps = append(p.Steps, flow.Step{Kind: flow.StepAttach, Intent: in, Mode: AgentMode(in.Mode, f.Instance.VMState), Host: f.Instance.Host})
		case policy.IntentRelease:
			var take []flow.Attachment
			var inFlight bool
			for _, a := range f.Attachments {
				if busy[a.ID.String()] {
					continue
				}
				if a.State != flow.AttAttached {
					inFlight = inFlight || a.State == flow.AttPending || a.State == flow.AttReleasing
					continue
				}
				if in.Profile != "" && a.Profile != "" && a.Profile != in.Profile {
					continue
				}
				take = append(take, a)
				if in.Count > 0 && len(take) >= in.Count {
					break
				}
			}
			if len(take) == 0 {
				if inFlight {
					return fail(flow.CodeBusy, "a change of this instance's vGPUs is still in progress; retry when it is finished")
				}
				if f.Instance.FlavorVGPUs > 0 && !f.Deleting && !busy[flavorVGPUs] {
					// The vGPUs of its flavor go back through Nova: a resize to
					// the flavor without vGPU (package novaresize).
					if why, code := novaHostProblem(f); why != "" {
						return fail(code, why)
					}
					busy[flavorVGPUs] = true
					p.Steps = append(p.Steps, flow.Step{Kind: flow.StepNovaResize, Intent: in, Host: f.Instance.Host})
					continue
				}
				p.Notes = append(p.Notes, "release: the instance holds no vGPU")
				continue
			}
			for _, a := range take {
				busy[a.ID.String()] = true
			}
			p.Steps = append(p.Steps, flow.Step{Kind: flow.StepRelease, Intent: in, Release: take, RemoveOnly: f.Deleting, Host: take[0].Host})
		case policy.IntentSetLimits:
			if f.Deleting || f.Instance.Host == "" {
				p.Notes = append(p.Notes, "set_limits: the instance has no host")
				continue
			}
			mem, err := MemoryBytes(in.MemoryHigh)
			if err != nil {
				p.Notes = append(p.Notes, "set_limits: "+err.Error())
				continue
			}
			p.Steps = append(p.Steps, flow.Step{Kind: flow.StepCommand, Intent: in, Command: protocol.SetVMLimits, Host: f.Instance.Host,
				Params: protocol.LimitParams{CPUMax: in.CPUMax, MemoryHigh: mem}})
		case policy.IntentTune:
			if in.Scheduler == "" && in.ClocksMHz == 0 {
				p.Notes = append(p.Notes, "tune: neither a scheduler nor clocks to set")
				continue
			}
			gpus := in.GPUs
			if len(gpus) == 0 {
				seen := map[string]bool{}
				for _, a := range f.Attachments {
					if a.PCIAddress != "" && !seen[a.PCIAddress] && a.State != flow.AttReleasing {
						seen[a.PCIAddress] = true
						gpus = append(gpus, a.PCIAddress)
					}
				}
			}
			if len(gpus) == 0 || f.Instance.Host == "" {
				p.Notes = append(p.Notes, "tune: no physical GPU of the instance is known to the bridge")
				continue
			}
			for _, g := range gpus {
				if in.Scheduler != "" {
					p.Steps = append(p.Steps, flow.Step{Kind: flow.StepCommand, Intent: in, Command: protocol.SetVGPUScheduler, Host: f.Instance.Host,
						Params: protocol.SchedulerParams{GPUPCI: g, Policy: in.Scheduler, TimesliceUs: uint32(max(in.TimesliceUS, 0))}})
				}
				switch {
				case in.ClocksMHz > 0: // the SM clock; the agent keeps the memory clock
					p.Steps = append(p.Steps, flow.Step{Kind: flow.StepCommand, Intent: in, Command: protocol.SetClocks, Host: f.Instance.Host,
						Params: protocol.ClockParams{GPUPCI: g, SMMHz: uint32(in.ClocksMHz)}})
				case in.ClocksMHz < 0: // back to the GPU's defaults
					p.Steps = append(p.Steps, flow.Step{Kind: flow.StepCommand, Intent: in, Command: protocol.ResetClocks, Host: f.Instance.Host,
						Params: protocol.ClockParams{GPUPCI: g}})
				}
			}
		case policy.IntentNotify:
			p.Steps = append(p.Steps, flow.Step{Kind: flow.StepNotify, Intent: in})
		case policy.IntentMove:
			steps, note, code := planMove(in, f, busy)
			if code != "" {
				return fail(code, note)
			}
			if note != "" {
				p.Notes = append(p.Notes, note)
			}
			p.Steps = append(p.Steps, steps...)
		case policy.IntentResize:
			if in.Trait == "" {
				return fail(flow.CodeUnsupported, fmt.Sprintf("profile %s has no known vGPU type (no agent reported it and the profile seed names no type id)", in.Profile))
			}
			direct := in.Mode == policy.ModeDirectLive || in.Mode == policy.ModeDirectCold
			held := slices.ContainsFunc(f.Attachments, func(a flow.Attachment) bool {
				return !busy[a.ID.String()] && a.State != flow.AttReleased && a.State != flow.AttFailed
			})
			if !held && (f.Instance.FlavorVGPUs > 0 || !direct) {
				// The vGPU is the flavor's (or, on the Nova path, there is
				// none yet): Nova resizes to the flavor of the same sizes with
				// the new profile (package novaresize). A vGPU the bridge
				// attached changes on the direct path, whatever the mode.
				if why, code := novaHostProblem(f); why != "" {
					return fail(code, why)
				}
				busy[flavorVGPUs] = true
				p.Steps = append(p.Steps, flow.Step{Kind: flow.StepNovaResize, Intent: in, Host: f.Instance.Host})
				p.Notes = append(p.Notes, frameRateNote(in)...)
				continue
			}
			if why, code := hostProblem(f); why != "" {
				return fail(code, why)
			}
			// Break before make: a VM holds one fractional vGPU, so the old
			// ones are detached and removed, then the new ones created and
			// attached on a GPU of the host that offers the profile (claimed
			// before anything is sent). On a failure the old ones come back
			// (compensate).
			var old []flow.Attachment
			for _, a := range f.Attachments {
				switch {
				case busy[a.ID.String()]:
				case a.State == flow.AttPending || a.State == flow.AttReleasing:
					return fail(flow.CodeBusy, "a change of this instance's vGPUs is still in progress; retry when it is finished")
				case a.State == flow.AttAttached:
					old = append(old, a)
				}
			}
			if len(old) == 0 {
				p.Notes = append(p.Notes, "resize: the instance holds no vGPU to change")
				continue
			}
			for _, a := range old {
				busy[a.ID.String()] = true
			}
			in.Count = len(old)
			p.Steps = append(p.Steps, flow.Step{Kind: flow.StepRelease, Intent: in, Release: old, Host: old[0].Host},
				flow.Step{Kind: flow.StepAttach, Intent: in, Mode: AgentMode(in.Mode, f.Instance.VMState), Host: f.Instance.Host})
		}
	}
	if f.Rebuilt && !f.Deleting {
		var again []flow.Attachment
		for _, a := range f.Attachments {
			if a.State == flow.AttAttached && a.Host == f.Instance.Host && !busy[a.ID.String()] {
				again = append(again, a)
			}
		}
		if len(again) > 0 {
			p.Steps = append(p.Steps, flow.Step{Kind: flow.StepReattach, Release: again, Host: f.Instance.Host})
		}
	}
	if p.Actions() {
		p.Outcome = flow.OutcomeAct
		return p
	}
	switch {
	case len(d.Refused) > 0 && d.Refused[0].Code == policy.RefusalQuota:
		p.Outcome, p.Code, p.Reason = flow.OutcomeReject, flow.CodeQuota, d.Refused[0].Reason
	case len(d.Refused) > 0:
		p.Outcome, p.Code, p.Reason = flow.OutcomeReject, flow.CodeRefused, d.Refused[0].Reason
	case len(p.Notes) > 0:
		p.Outcome, p.Code, p.Reason = flow.OutcomeReject, flow.CodeRefused, p.Notes[0]
	default:
		p.Outcome, p.Code, p.Reason = flow.OutcomeNothing, flow.CodeNoAction, nothingReason(d)
	}
	return p
}

// planMove plans a move() intent: the vGPUs the bridge attached on the
// GPU the intent leaves (in.GPUs, the event's label gpu) go to another GPU
// of the instance's host with the same profile, as a direct-path resize
// does it: break before make (a VM holds one fractional vGPU), the new
// claim made, on a GPU other than the one left, before anything is sent,
// and the old vGPUs restored on a failure (compensate). A vGPU of the
// instance's flavor is Nova's: it stays, with a note. It returns the
// steps, or a note (nothing to move), or a failure's reason and code.
func planMove(in policy.Intent, f Facts, busy map[string]bool) ([]flow.Step, string, string) {
	leave := ""
	if len(in.GPUs) > 0 {
		leave = in.GPUs[0]
	}
	var old []flow.Attachment
	var exclude []string
	for _, a := range f.Attachments {
		switch {
		case busy[a.ID.String()] || a.PCIAddress != leave:
		case a.State == flow.AttPending || a.State == flow.AttReleasing:
			return nil, "a change of this instance's vGPUs is still in progress; retry when it is finished", flow.CodeBusy
		case a.State == flow.AttAttached:
			old = append(old, a)
			if !slices.Contains(exclude, a.Provider) {
				exclude = append(exclude, a.Provider)
			}
		}
	}
	if len(old) == 0 {
		if f.Instance.FlavorVGPUs > 0 && !busy[flavorVGPUs] {
			// The vGPU comes with the flavor (the Nova path): a cold
			// migration through Nova, the flavor kept, moves it (package
			// novaresize); Nova's scheduler keeps it off a faulted GPU
			// when the flavor forbids the fault trait.
			if why, code := novaHostProblem(f); why != "" {
				return nil, why, code
			}
			busy[flavorVGPUs] = true
			at := in
			at.Count = f.Instance.FlavorVGPUs
			at.Why = fmt.Sprintf("%s; a cold migration through Nova moves the flavor's vGPU off GPU %s of host %s", in.Why, orDefault(leave, "(none)"), f.Instance.Host)
			return []flow.Step{{Kind: flow.StepNovaResize, Intent: at, Host: f.Instance.Host}}, "", ""
		}
		return nil, fmt.Sprintf("move: the instance holds no vGPU of the bridge's on GPU %s", orDefault(leave, "(none)")), ""
	}
	if why, code := hostProblem(f); why != "" {
		return nil, why, code
	}
	mode := AgentMode(policy.ModeDirectLive, f.Instance.VMState)
	if old[0].Mode == protocol.ModeCold {
		mode = protocol.ModeCold
	}
	steps := []flow.Step{{Kind: flow.StepRelease, Intent: in, Release: old, Host: old[0].Host}}
	// One attach per profile, in the order of the attachments.
	var profiles []string
	count := map[string]int{}
	for _, a := range old {
		busy[a.ID.String()] = true
		if count[a.Profile] == 0 {
			profiles = append(profiles, a.Profile)
		}
		count[a.Profile] += max(a.Amount, 1)
	}
	for _, prof := range profiles {
		i := slices.IndexFunc(old, func(a flow.Attachment) bool { return a.Profile == prof })
		a := old[i]
		if a.Trait == "" {
			return nil, fmt.Sprintf("move: the vGPU %s on GPU %s has no known vGPU type trait", a.ID, leave), flow.CodeUnsupported
		}
		at := in
		at.Profile, at.TypeID, at.Trait, at.Count, at.FrameRateLimit = a.Profile, a.TypeID, a.Trait, count[prof], a.FrameRateLimit
		at.Why = fmt.Sprintf("%s; %d × %s off GPU %s to another GPU of host %s", in.Why, count[prof], prof, leave, f.Instance.Host)
		steps = append(steps, flow.Step{Kind: flow.StepAttach, Intent: at, Mode: mode, Host: f.Instance.Host, Exclude: exclude})
	}
	return steps, "", ""
}

// hostProblem says why the direct path cannot act on the instance's host:
// novaHostProblem's reasons, or an agent that stopped reporting.
func hostProblem(f Facts) (string, string) {
	if why, code := novaHostProblem(f); why != "" {
		return why, code
	}
	if in := f.Instance; !f.LastReport.IsZero() && f.StaleAge > 0 && f.Now.Sub(f.LastReport) > f.StaleAge {
		return fmt.Sprintf("host %s last reported at %s, more than %s ago: its agent looks down", in.Host,
			f.LastReport.UTC().Format(time.RFC3339), f.StaleAge), flow.CodeHostStale
	}
	return "", ""
}

// AgentMode maps the policy's attach mode to the agent's: a live attach
// to a domain that is not running changes its definition only.
func AgentMode(m policy.AttachMode, vmState string) string {
	if m == policy.ModeDirectCold {
		return protocol.ModeCold
	}
	if vmState != "" && vmState != "active" {
		return protocol.ModeConfig
	}
	return protocol.ModeLive
}

func nothingReason(d *policy.Decision) string {
	var fired []string
	for _, r := range d.Rules {
		if r.Outcome == policy.OutcomeHolding || r.Outcome == policy.OutcomeCooldown {
			fired = append(fired, fmt.Sprintf("%s: %s", r.Rule, r.Detail))
		}
	}
	if len(fired) > 0 {
		return "no change now (" + strings.Join(fired, "; ") + ")"
	}
	if len(d.Rules) == 0 {
		return "no policy rule listens to " + d.Kind
	}
	return "no policy rule asked for a change"
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// MemoryBytes turns a cgroup-style size ("64G", "512M", "1073741824",
// "max") into what set_vm_limits takes: a byte count or "max". "" stays "".
func MemoryBytes(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "max" {
		return s, nil
	}
	mult := uint64(1)
	num := strings.TrimSuffix(strings.TrimSuffix(s, "i"), "B")
	if n := len(num); n > 0 {
		switch num[n-1] {
		case 'K', 'k':
			mult, num = 1<<10, num[:n-1]
		case 'M', 'm':
			mult, num = 1<<20, num[:n-1]
		case 'G', 'g':
			mult, num = 1<<30, num[:n-1]
		case 'T', 't':
			mult, num = 1<<40, num[:n-1]
		}
	}
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil || v == 0 {
		return "", fmt.Errorf("memory_high %q is not a size such as 64G or a byte count", s)
	}
	if v > (1<<63)/mult {
		return "", fmt.Errorf("memory_high %q is too large", s)
	}
	return strconv.FormatUint(v*mult, 10), nil
}

// NewCommand builds an agent command.
func NewCommand(kind protocol.Kind, host, requestID, instance string, params any, issued, expires time.Time) (protocol.Command, error) {
	c := protocol.Command{V: protocol.Version, Minor: protocol.Minor, ID: uuid.NewString(), Kind: kind, Host: host, RequestID: requestID,
		InstanceUUID: instance, IssuedAt: issued.UTC(), ExpiresAt: expires.UTC()}
	if params != nil {
		if err := c.MarshalParams(params); err != nil {
			return c, err
		}
	}
	return c, c.Validate()
}

// novaHostProblem is hostProblem for the Nova path: Nova chooses the
// host, so the current host's agent may be stale.
func novaHostProblem(f Facts) (string, string) {
	in := f.Instance
	switch {
	case !in.Known && in.Absent:
		return fmt.Sprintf("instance %s is not known to the bridge, and Nova has no such server (GET /servers/%s answered 404 just now)", in.UUID, in.UUID), flow.CodeNoInstance
	case !in.Known:
		return fmt.Sprintf("instance %s is not known to the bridge (no Nova notification or listing of Nova's servers named it yet)", in.UUID), flow.CodeNoInstance
	case in.Deleted:
		return fmt.Sprintf("instance %s is deleted", in.UUID), flow.CodeNoInstance
	case in.Host == "":
		return fmt.Sprintf("instance %s has no compute host (not scheduled yet, or shelved)", in.UUID), flow.CodeNoHost
	}
	return "", ""
}

func novaStep(steps []flow.Step) (flow.Step, bool) {
	for _, s := range steps {
		if s.Kind == flow.StepNovaResize {
			return s, true
		}
	}
	return flow.Step{}, false
}

// frameRateNote says why a workload's frame-rate limiter is not applied on
// the Nova path: NVIDIA's vgpu_params is written between creating the mdev
// and the VM opening it, and there it is Nova that creates the mdev.
func frameRateNote(in policy.Intent) []string {
	if in.FrameRateLimit == nil {
		return nil
	}
	return []string{"frame_rate_limit: not applied: on the Nova path Nova creates the vGPU's mdev, and NVIDIA's " +
		"nvidia/vgpu_params can only be set between its creation and the VM's start; the driver's default limiter stays"}
}
