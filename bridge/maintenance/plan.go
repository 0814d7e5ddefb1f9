// SPDX-License-Identifier: Apache-2.0

// Package maintenance plans the move of every vGPU VM off a compute host
// before its maintenance (a GPU driver upgrade, a repair): the planning
// half of `vgpuctl host migrate-all HOST` (doc/source/operations.rst,
// "Host maintenance").
//
// A VM's vGPU comes either from its flavor (resources:VGPU, the Nova
// path: Nova moves it, and only a recent stack — Nova 2024.1+, libvirt
// ≥ 8.6, QEMU ≥ 8.1 — live-migrates it; anything older loses or refuses
// it, so it is cold-migrated and confirmed unless [maintenance]
// live_migrate_vgpu says the stack supports it) or from the bridge (the
// direct path: the agent attached an mdev Nova does not know about). A
// direct-path VM has its vGPU detached through the agent, is live-migrated
// (cold-migrated when it is shut off) without it, and gets a vGPU of the
// same profile on the target, reserved in Placement under a reservation
// consumer of the bridge's own before the move and moved into the
// instance's consumer once Nova is done (placement.Service.
// TransferReservation).
//
// Plan is pure: it decides per VM from what the caller read (Nova's
// servers on the host, the bridge's attachments, the option) and a
// Chooser of target hosts, so that the dry run and the real run decide
// alike.
package maintenance

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// State is a VM's progress in a maintenance operation.
type State string

// The states of a VM, in order; Done and Failed are final.
const (
	Pending    State = "pending"
	Detaching  State = "detaching"  // direct path: reserve on the target, detach through the agent
	Migrating  State = "migrating"  // Nova moves the instance
	Confirming State = "confirming" // cold migration: confirm once VERIFY_RESIZE
	Attaching  State = "attaching"  // direct path: reservation into the instance's consumer, attach on the target
	Done       State = "done"
	Failed     State = "failed"
)

// States lists every state in order.
var States = []State{Pending, Detaching, Migrating, Confirming, Attaching, Done, Failed}

// Final reports whether nothing follows s.
func (s State) Final() bool { return s == Done || s == Failed }

// Allowed reports whether a VM may go from one state to another: forward
// along its plan's steps (a state may be skipped: a Nova-path VM never
// detaches), or to Failed from any state that is not final.
func Allowed(from, to State) bool {
	if from.Final() {
		return false
	}
	if to == Failed {
		return true
	}
	return slices.Index(States, to) > slices.Index(States, from)
}

// Path is where a VM's vGPU comes from.
type Path string

// The paths.
const (
	PathNova   Path = "nova"   // the flavor's resources:VGPU
	PathDirect Path = "direct" // attached by the bridge through the agent
)

// Action is how a VM leaves the host.
type Action string

// The actions.
const (
	ColdMigrate Action = "cold_migrate" // Nova path: migrate, confirm
	LiveMigrate Action = "live_migrate" // Nova path with live_migrate_vgpu
	// MoveDirect: reserve on the target, detach, live-migrate (or
	// cold-migrate and confirm when shut off), transfer, attach.
	MoveDirect Action = "move_direct"
	Skip       Action = "skip" // left alone: Reason says why
)

// DirectVGPU is one vGPU the bridge attached to a VM.
type DirectVGPU struct {
	Mdev     string // the mdev uuid (the attachment's id)
	Profile  string // e.g. T4-4Q
	TypeID   string // e.g. nvidia-232
	Trait    string // e.g. CUSTOM_NVIDIA_232
	Provider string // the GPU provider on the source
	Class    string // its resource class ("": VGPU)
	Amount   int    // units; 0 means 1
}

// VM is what the caller read of one instance on the host.
type VM struct {
	Instance  string
	Name      string
	Status    string // Nova's: ACTIVE, SHUTOFF, …
	TaskState string // Nova's task_state; "" when none runs
	// FlavorVGPUs are the units of its flavor's resources:VGPU.
	FlavorVGPUs int
	// Direct are the bridge's attached vGPUs.
	Direct []DirectVGPU
}

// Options are the operation's options.
type Options struct {
	// Concurrency is how many VMs move at once (0: 1).
	Concurrency int `json:"concurrency"`
	// StopOnFailure stops starting VMs after the first failure.
	StopOnFailure bool `json:"stop_on_failure"`
	// DryRun lists what would happen and does nothing.
	DryRun bool `json:"dry_run"`
	// Target is the host to move to; "": Nova's scheduler chooses for
	// the Nova path, the Chooser for the direct path (which must reserve
	// on a known host before the move).
	Target string `json:"target,omitempty"`
	// LiveMigrateVGPU is [maintenance] live_migrate_vgpu: live-migrate
	// Nova-path vGPU VMs (Nova 2024.1+, libvirt ≥ 8.6, QEMU ≥ 8.1).
	LiveMigrateVGPU bool `json:"live_migrate_vgpu"`
}

// MaxConcurrency bounds Options.Concurrency.
const MaxConcurrency = 16

// DefaultOptions are the defaults of the command and the API.
func DefaultOptions() Options { return Options{Concurrency: 1, StopOnFailure: true} }

// Validate refuses impossible options for a move off host.
func (o Options) Validate(host string) error {
	switch {
	case host == "":
		return errors.New("no host")
	case o.Concurrency < 0 || o.Concurrency > MaxConcurrency:
		return fmt.Errorf("concurrency %d: want 1 to %d", o.Concurrency, MaxConcurrency)
	case o.Target == host:
		return fmt.Errorf("target %s is the host being emptied", host)
	}
	return nil
}

// Chooser picks the target host of a direct-path VM's vGPUs: a host
// other than the excluded ones with room for them, or an error saying why
// none fits.
type Chooser interface {
	ChooseHost(need []DirectVGPU, exclude []string) (string, error)
}

// Step is one state of a VM's plan and what happens in it.
type Step struct {
	State State  `json:"state"`
	What  string `json:"what"`
}

// VMPlan is what happens to one VM.
type VMPlan struct {
	Instance string `json:"instance_uuid"`
	Name     string `json:"name,omitempty"`
	Path     Path   `json:"path,omitempty"`
	Action   Action `json:"action"`
	// Target is the host chosen for a direct-path VM (or the operation's
	// target); "" leaves it to Nova's scheduler.
	Target string `json:"target,omitempty"`
	Reason string `json:"reason,omitempty"` // why it is skipped
	Steps  []Step `json:"steps,omitempty"`
}

// Plan is the operation's plan.
type Plan struct {
	Host    string   `json:"host"`
	Drain   bool     `json:"drain"`   // the operation drains the host (it is not drained yet) …
	Undrain bool     `json:"undrain"` // … and so undrains it when done
	Options Options  `json:"options"`
	VMs     []VMPlan `json:"vms"`
}

// Moves counts the VMs that move.
func (p Plan) Moves() int {
	n := 0
	for _, v := range p.VMs {
		if v.Action != Skip {
			n++
		}
	}
	return n
}

// Build plans the move of the VMs (every instance on host that holds a
// vGPU; others are the operator's business and are not given) off host.
// drained says whether the host is drained already. VMs are planned in
// name order (then instance). The Chooser is asked for direct-path VMs
// when no target is given, once per VM in plan order, so a Chooser may
// count what it chose for the VMs before (the run reserves in the same
// order, and a reservation that no longer fits fails that VM only).
func Build(host string, drained bool, vms []VM, o Options, ch Chooser) (Plan, error) {
	if err := o.Validate(host); err != nil {
		return Plan{}, err
	}
	o.Concurrency = max(o.Concurrency, 1)
	p := Plan{Host: host, Drain: !drained, Undrain: !drained, Options: o}
	vms = slices.Clone(vms)
	slices.SortFunc(vms, func(a, b VM) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Instance, b.Instance))
	})
	for _, vm := range vms {
		p.VMs = append(p.VMs, planVM(host, vm, o, ch))
	}
	return p, nil
}

func planVM(host string, vm VM, o Options, ch Chooser) VMPlan {
	v := VMPlan{Instance: vm.Instance, Name: vm.Name, Action: Skip}
	nova, direct := vm.FlavorVGPUs > 0, len(vm.Direct) > 0
	switch {
	case nova && direct:
		v.Path = PathNova
		v.Reason = "holds a vGPU of its flavor and one the bridge attached: move it by hand (release the bridge's vGPU first)"
		return v
	case nova:
		v.Path = PathNova
	case direct:
		v.Path = PathDirect
	default:
		v.Reason = "holds no vGPU"
		return v
	}
	if vm.TaskState != "" {
		v.Reason = fmt.Sprintf("Nova is busy with it (task %s): run again once it is done", vm.TaskState)
		return v
	}
	active, off := vm.Status == "ACTIVE", vm.Status == "SHUTOFF"
	if !active && !off {
		v.Reason = fmt.Sprintf("status %s: only ACTIVE and SHUTOFF servers are moved", orDash(vm.Status))
		return v
	}
	where := "to " + o.Target
	if o.Target == "" {
		where = "to a host Nova's scheduler chooses"
	}
	v.Target = o.Target
	if nova {
		if o.LiveMigrateVGPU && active {
			v.Action = LiveMigrate
			v.Steps = []Step{{Migrating, "live-migrate through Nova (os-migrateLive) " + where + " with its vGPU ([maintenance] live_migrate_vgpu)"}}
			return v
		}
		v.Action = ColdMigrate
		v.Steps = []Step{
			{Migrating, "cold-migrate through Nova (migrate) " + where + "; Nova gives it a vGPU of its flavor there"},
			{Confirming, "confirm the migration once the server is VERIFY_RESIZE"},
		}
		return v
	}
	if v.Target == "" {
		if ch == nil {
			v.Reason = "no target host given and none can be chosen"
			return v
		}
		t, err := ch.ChooseHost(vm.Direct, []string{host})
		if err != nil {
			v.Reason = "no target host for its vGPUs: " + err.Error()
			return v
		}
		v.Target = t
	}
	v.Action = MoveDirect
	profiles := make([]string, len(vm.Direct))
	mdevs := make([]string, len(vm.Direct))
	for i, d := range vm.Direct {
		profiles[i] = fmt.Sprintf("%s ×%d", cmp.Or(d.Profile, d.Trait), max(d.Amount, 1))
		mdevs[i] = d.Mdev
	}
	move := []Step{{Migrating, "live-migrate through Nova (os-migrateLive) to " + v.Target + " without vGPU"}}
	if off {
		move = []Step{
			{Migrating, "cold-migrate through Nova (migrate) to " + v.Target + " without vGPU (shut off)"},
			{Confirming, "confirm the migration once the server is VERIFY_RESIZE"},
		}
	}
	v.Steps = append([]Step{{Detaching, fmt.Sprintf("reserve %s on %s under a reservation consumer; detach and remove mdev %s through the agent on %s",
		strings.Join(profiles, ", "), v.Target, strings.Join(mdevs, ", "), host)}}, move...)
	v.Steps = append(v.Steps, Step{Attaching, fmt.Sprintf("move the reservation into the instance's consumer (one POST /allocations); attach %s through the agent on %s",
		strings.Join(profiles, ", "), v.Target)})
	return v
}

func orDash(s string) string { return cmp.Or(s, "-") }

// Render writes the plan as the dry run shows it.
func (p Plan) Render(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "host %s: %d VM(s) with a vGPU, %d to move (concurrency %d, stop on failure %t)\n",
		p.Host, len(p.VMs), p.Moves(), p.Options.Concurrency, p.Options.StopOnFailure)
	if p.Drain {
		b.WriteString("drain the host first (undrain it when done)\n")
	} else {
		b.WriteString("the host is drained already (it stays drained)\n")
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tNAME\tPATH\tACTION\tTARGET")
	for _, v := range p.VMs {
		target := v.Target
		if target == "" && v.Action != Skip {
			target = "(Nova's scheduler)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Instance, orDash(v.Name), orDash(string(v.Path)), v.Action, orDash(target))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range p.VMs {
		fmt.Fprintf(&b, "\n%s (%s):\n", orDash(v.Name), v.Instance)
		if v.Action == Skip {
			fmt.Fprintf(&b, "  skipped: %s\n", v.Reason)
			continue
		}
		for i, s := range v.Steps {
			fmt.Fprintf(&b, "  %d. [%s] %s\n", i+1, s.State, s.What)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
