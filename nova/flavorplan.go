package nova

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// PlanFlavor is a Nova flavor as PlanFlavors reads and proposes it: the
// sizes, the visibility and the extra specs (what makes two flavors
// equal here; the id, description and rxtx_factor do not count).
type PlanFlavor struct {
	ID         string            `json:"id,omitempty"`
	Name       string            `json:"name"`
	VCPUs      int               `json:"vcpus"`
	RAM        int               `json:"ram"`       // MiB
	Disk       int               `json:"disk"`      // GiB
	Ephemeral  int               `json:"ephemeral"` // GiB
	Swap       int               `json:"swap"`      // MiB
	Public     bool              `json:"is_public"`
	ExtraSpecs map[string]string `json:"extra_specs"`
}

// PlanProfile is a vGPU profile flavors are planned for: its name (T4-4Q)
// and the Placement trait of its type (CUSTOM_NVIDIA_232 for nvidia-232),
// which the GPU providers typed for it carry.
type PlanProfile struct {
	Name   string `json:"name"`
	TypeID string `json:"type_id,omitempty"`
	Trait  string `json:"trait"`
	// Alias, when set, is the Nova PCI alias ([pci] alias) of the
	// profile's Nova-owned VFs: its flavors ask for pci_passthrough:alias=
	// ALIAS:1 (Nova's PciPassthroughFilter places them on a VF), not for
	// resources:VGPU and the trait.
	Alias string `json:"alias,omitempty"`
	// DriverBranch, when not 0, is the guest driver release branch (550)
	// the profile's flavors require: they are named
	// BASE.vgpu-PROFILE-rBRANCH (PlannedBranchFlavorName) and ask, in the
	// VGPU's request group, for trait1:CUSTOM_VGPU_GUEST_DRIVER_RBRANCH=
	// required (GuestDriverTrait), which the bridge keeps on the GPU
	// providers whose host's vGPU manager serves that branch ([placement]
	// add_driver_traits). 1 to MaxDriverBranch; not with Alias (a
	// Nova-owned VF's PCI request carries no trait).
	DriverBranch int `json:"driver_branch,omitempty"`
}

// AliasSpec is the flavor extra spec of Nova's PCI passthrough requests
// (nova.pci.request.get_pci_requests_from_flavor).
const AliasSpec = "pci_passthrough:alias"

// PlanAction says what a proposal needs.
type PlanAction string

// The actions of a plan, and (PlanCreated, PlanFailed) the outcomes of
// applying a PlanCreate.
const (
	// PlanCreate: no flavor of the proposal's name exists, nor an equal one.
	PlanCreate PlanAction = "create"
	// PlanExists: a flavor of the name exists with the proposal's contents.
	PlanExists PlanAction = "exists"
	// PlanCovered: no flavor has the name, but an equal flavor exists (or
	// is planned, earlier in the plan) under another name, Existing.
	PlanCovered PlanAction = "covered"
	// PlanConflict: a flavor of the name exists with other contents; it is
	// left alone, Differences say how it differs.
	PlanConflict PlanAction = "conflict"
	// PlanCreated: the proposal was created (set by whoever applies it).
	PlanCreated PlanAction = "created"
	// PlanFailed: creating the proposal failed (set by whoever applies it).
	PlanFailed PlanAction = "failed"
)

// FlavorProposal is one vGPU flavor of a plan: Flavor (no ID) is BasedOn's
// sizes and extra specs plus one VGPU of Profile.
type FlavorProposal struct {
	Flavor  PlanFlavor `json:"flavor"`
	BasedOn string     `json:"based_on"`
	Profile string     `json:"profile"`
	Trait   string     `json:"trait"`
	// DriverBranch is the guest driver branch the flavor requires (its
	// profile's PlanProfile.DriverBranch), 0 for none.
	DriverBranch int        `json:"driver_branch,omitempty"`
	Action       PlanAction `json:"action"`
	// Existing names the flavor of the same name (exists, conflict), or
	// the equal one under another name (covered).
	Existing string `json:"existing,omitempty"`
	// ExistingID is Existing's id ("" for a flavor the plan creates).
	ExistingID string `json:"existing_id,omitempty"`
	// Differences are how the flavor of the name differs (conflict):
	// "ram 4096, planned 2048", "extra spec trait:X missing", …
	Differences []string `json:"differences,omitempty"`
	// Detail is a line for people: what to create, what covers it, what
	// differs.
	Detail string `json:"detail,omitempty"`
}

// PlanSkip is a flavor or profile the plan leaves out, and why.
type PlanSkip struct {
	Flavor  string `json:"flavor,omitempty"`
	Profile string `json:"profile,omitempty"`
	Reason  string `json:"reason"`
	// VGPU: the flavor asks for a vGPU already (a vGPU flavor, not a base).
	VGPU bool `json:"vgpu,omitempty"`
}

// FlavorPlan is the answer of PlanFlavors.
type FlavorPlan struct {
	Proposals []FlavorProposal `json:"proposals"`
	Skipped   []PlanSkip       `json:"skipped"`
}

// MaxFlavorName is the longest flavor name Nova accepts.
const MaxFlavorName = 255

// PlannedFlavorName is the name of the vGPU flavor of base for profile:
// "m1.small" and T4-4Q give "m1.small.vgpu-t4-4q", the name the bridge
// suggests when it finds no vGPU flavor for a resize (and strips to find
// the flavor a release goes back to). The profile part keeps letters,
// digits, '.', '_' and '-' (lower case); anything else becomes '-'.
func PlannedFlavorName(base, profile string) string {
	var b strings.Builder
	b.WriteString(base)
	b.WriteString(".vgpu-")
	for _, c := range strings.ToLower(profile) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// PlannedBranchFlavorName is the name of the vGPU flavor of base for
// profile that requires guest driver branch: PlannedFlavorName plus
// "-r" and the branch ("m1.small", T4-4Q and 550 give
// "m1.small.vgpu-t4-4q-r550"), so that it does not take the name of the
// flavor without a branch. Branch 0 gives PlannedFlavorName.
func PlannedBranchFlavorName(base, profile string, branch int) string {
	name := PlannedFlavorName(base, profile)
	if branch != 0 {
		name += "-r" + strconv.Itoa(branch)
	}
	return name
}

// PlanGroup is the request group of the vGPU in the flavors PlanFlavors
// proposes ("1": resources1:VGPU, trait1:…).
const PlanGroup = "1"

// PlanFlavors proposes, for each flavor that asks for no vGPU and each
// profile, the flavor BASE.vgpu-PROFILE (PlannedFlavorName) with the
// base's sizes, visibility and extra specs plus, in request group 1
// (PlanGroup), resources1:VGPU=1, trait1:TRAIT=required and
// trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden (GPUFaultTrait); for a
// profile with a DriverBranch, BASE.vgpu-PROFILE-rBRANCH with also
// trait1:CUSTOM_VGPU_GUEST_DRIVER_RBRANCH=required (GuestDriverTrait). It
// says what each needs against the flavors that exist (PlanCreate, PlanExists, PlanCovered, PlanConflict). Flavors that
// ask for a vGPU, flavors with malformed extra specs, and profiles without
// a valid trait are in Skipped. base, when not nil, says which flavors may
// be bases (e.g. by name); the others still count as existing flavors.
// Proposals are sorted by base flavor name, then profile name; Skipped by
// flavor, then profile. Neither input is modified.
func PlanFlavors(flavors []PlanFlavor, profiles []PlanProfile, base func(PlanFlavor) bool) FlavorPlan {
	plan := FlavorPlan{Proposals: []FlavorProposal{}, Skipped: []PlanSkip{}}
	isBase := func(f PlanFlavor) bool { return base == nil || base(f) }

	fl := slices.Clone(flavors)
	slices.SortStableFunc(fl, func(a, b PlanFlavor) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	byName := map[string]PlanFlavor{}
	for _, f := range fl {
		if _, dup := byName[f.Name]; !dup {
			byName[f.Name] = f
		}
	}

	pr := slices.Clone(profiles)
	slices.SortStableFunc(pr, func(a, b PlanProfile) int { return strings.Compare(a.Name, b.Name) })
	var good []PlanProfile
	seen := map[string]bool{}
	for _, p := range pr {
		if seen[p.Name] {
			continue
		}
		seen[p.Name] = true
		if p.DriverBranch != 0 {
			switch {
			case p.DriverBranch < 0 || p.DriverBranch > MaxDriverBranch:
				plan.Skipped = append(plan.Skipped, PlanSkip{Profile: p.Name, Reason: fmt.Sprintf("driver branch %d: want 1 to %d", p.DriverBranch, MaxDriverBranch)})
				continue
			case p.Alias != "":
				plan.Skipped = append(plan.Skipped, PlanSkip{Profile: p.Name,
					Reason: fmt.Sprintf("driver branch %d: a Nova-owned VF's PCI request (%s) carries no trait, so its flavors cannot require a guest driver branch", p.DriverBranch, AliasSpec)})
				continue
			}
		}
		if p.Alias != "" {
			if strings.ContainsAny(p.Alias, ":, ") {
				plan.Skipped = append(plan.Skipped, PlanSkip{Profile: p.Name, Reason: fmt.Sprintf("alias %q: a PCI alias name has no ':', ',' or space", p.Alias)})
				continue
			}
			good = append(good, p)
			continue
		}
		if p.Trait == "" {
			plan.Skipped = append(plan.Skipped, PlanSkip{Profile: p.Name, Reason: "no trait: the profile's type id is not known yet"})
			continue
		}
		if err := checkName(p.Trait, "trait"); err != nil {
			plan.Skipped = append(plan.Skipped, PlanSkip{Profile: p.Name, Reason: err.Error()})
			continue
		}
		good = append(good, p)
	}

	// planned: the contents of the flavors this plan creates, by name, to
	// cover later proposals equal to them.
	type planned struct {
		name string
		f    PlanFlavor
	}
	var creates []planned
	for i, base := range fl {
		if i > 0 && fl[i-1].Name == base.Name {
			continue // duplicate name: the first (by id) only
		}
		if !isBase(base) {
			continue
		}
		d, err := ParseExtraSpecs(base.ExtraSpecs)
		switch {
		case err != nil:
			plan.Skipped = append(plan.Skipped, PlanSkip{Flavor: base.Name, Reason: err.Error()})
			continue
		case d.HasVGPU():
			plan.Skipped = append(plan.Skipped, PlanSkip{Flavor: base.Name, Reason: "asks for a vGPU already", VGPU: true})
			continue
		}
		for _, p := range good {
			name := PlannedBranchFlavorName(base.Name, p.Name, p.DriverBranch)
			if _, pci := base.ExtraSpecs[AliasSpec]; pci && p.Alias != "" {
				plan.Skipped = append(plan.Skipped, PlanSkip{Flavor: base.Name, Profile: p.Name, Reason: "asks for PCI devices already (" + AliasSpec + ")"})
				continue
			}
			if len(name) > MaxFlavorName {
				plan.Skipped = append(plan.Skipped, PlanSkip{Flavor: base.Name, Profile: p.Name,
					Reason: fmt.Sprintf("the name %s… is longer than Nova's %d characters", name[:40], MaxFlavorName)})
				continue
			}
			specs := maps.Clone(base.ExtraSpecs)
			if specs == nil {
				specs = map[string]string{}
			}
			if p.Alias != "" {
				specs[AliasSpec] = p.Alias + ":1"
			} else {
				// The vGPU in request group 1, so that the fault trait is
				// forbidden on the provider of the VGPU only (a GPU the
				// bridge marked faulted), not on the whole host; Placement
				// 8.0's unnumbered group also passes forbidden traits by
				// name (a 500 on PostgreSQL, ignored on MySQL). A Nova-owned
				// VF's PCI request group is Nova's own: no trait reaches it.
				delete(specs, "resources:"+ResourceVGPU) // a base's VGPU=0
				specs["resources"+PlanGroup+":"+ResourceVGPU] = "1"
				specs["trait"+PlanGroup+":"+p.Trait] = "required"
				specs["trait"+PlanGroup+":"+GPUFaultTrait] = "forbidden"
				if p.DriverBranch != 0 {
					// On the GPU provider itself (the VGPU's group): the
					// bridge keeps the driver traits on GPU providers only.
					specs["trait"+PlanGroup+":"+GuestDriverTrait(p.DriverBranch)] = "required"
				}
			}
			want := PlanFlavor{Name: name, VCPUs: base.VCPUs, RAM: base.RAM, Disk: base.Disk, Ephemeral: base.Ephemeral,
				Swap: base.Swap, Public: base.Public, ExtraSpecs: specs}
			prop := FlavorProposal{Flavor: want, BasedOn: base.Name, Profile: p.Name, Trait: p.Trait, DriverBranch: p.DriverBranch}
			if have, ok := byName[name]; ok {
				prop.Existing, prop.ExistingID = have.Name, have.ID
				if diff := FlavorDifferences(have, want); len(diff) == 0 {
					prop.Action, prop.Detail = PlanExists, "id "+have.ID
				} else {
					prop.Action, prop.Differences = PlanConflict, diff
					prop.Detail = "left alone: " + strings.Join(diff, "; ")
				}
				plan.Proposals = append(plan.Proposals, prop)
				continue
			}
			prop.Action = PlanCreate
			for _, f := range fl {
				if len(FlavorDifferences(f, want)) == 0 {
					prop.Action, prop.Existing, prop.ExistingID = PlanCovered, f.Name, f.ID
					prop.Detail = "equal to " + f.Name + " (id " + f.ID + ")"
					break
				}
			}
			if prop.Action == PlanCreate {
				for _, c := range creates {
					if len(FlavorDifferences(c.f, want)) == 0 {
						prop.Action, prop.Existing = PlanCovered, c.name
						prop.Detail = "equal to " + c.name + ", which this plan creates"
						break
					}
				}
			}
			if prop.Action == PlanCreate {
				creates = append(creates, planned{name, want})
				prop.Detail = describe(want, base, p)
				if !want.Public {
					prop.Detail += "; private like " + base.Name + ": grant projects access (openstack flavor set --project)"
				}
			}
			plan.Proposals = append(plan.Proposals, prop)
		}
	}
	slices.SortStableFunc(plan.Skipped, func(a, b PlanSkip) int {
		if c := strings.Compare(a.Flavor, b.Flavor); c != 0 {
			return c
		}
		return strings.Compare(a.Profile, b.Profile)
	})
	return plan
}

// FlavorDifferences says how have differs from want in what makes
// flavors equal for PlanFlavors: sizes, visibility and extra specs (a nil
// map equals an empty one). Nil when they are equal. Names and ids are
// not compared.
func FlavorDifferences(have, want PlanFlavor) []string {
	var out []string
	num := func(what string, h, w int) {
		if h != w {
			out = append(out, fmt.Sprintf("%s %d, planned %d", what, h, w))
		}
	}
	num("vcpus", have.VCPUs, want.VCPUs)
	num("ram", have.RAM, want.RAM)
	num("disk", have.Disk, want.Disk)
	num("ephemeral", have.Ephemeral, want.Ephemeral)
	num("swap", have.Swap, want.Swap)
	if have.Public != want.Public {
		out = append(out, fmt.Sprintf("is_public %t, planned %t", have.Public, want.Public))
	}
	for _, k := range slices.Sorted(maps.Keys(want.ExtraSpecs)) {
		h, ok := have.ExtraSpecs[k]
		switch {
		case !ok:
			out = append(out, "extra spec "+k+" missing")
		case h != want.ExtraSpecs[k]:
			out = append(out, fmt.Sprintf("extra spec %s=%s, planned %s", k, h, want.ExtraSpecs[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(have.ExtraSpecs)) {
		if _, ok := want.ExtraSpecs[k]; !ok {
			out = append(out, "extra spec "+k+"="+have.ExtraSpecs[k]+" not planned")
		}
	}
	return out
}

// describe is a proposal's contents on one line: "vcpus=2 ram=2048
// disk=20 + resources1:VGPU=1 trait1:CUSTOM_NVIDIA_232=required
// trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden" (and, with a driver
// branch, trait1:CUSTOM_VGPU_GUEST_DRIVER_R550=required), and how
// many extra specs come from the base.
func describe(f PlanFlavor, base PlanFlavor, p PlanProfile) string {
	var b strings.Builder
	fmt.Fprintf(&b, "vcpus=%d ram=%d disk=%d", f.VCPUs, f.RAM, f.Disk)
	if f.Ephemeral > 0 {
		fmt.Fprintf(&b, " ephemeral=%d", f.Ephemeral)
	}
	if f.Swap > 0 {
		fmt.Fprintf(&b, " swap=%d", f.Swap)
	}
	if p.Alias != "" {
		fmt.Fprintf(&b, " + %s=%s:1 (Nova-owned VF)", AliasSpec, p.Alias)
	} else {
		fmt.Fprintf(&b, " + resources%[1]s:%[2]s=1 trait%[1]s:%[3]s=required trait%[1]s:%[4]s=forbidden", PlanGroup, ResourceVGPU, p.Trait, GPUFaultTrait)
		if p.DriverBranch != 0 {
			fmt.Fprintf(&b, " trait%s:%s=required", PlanGroup, GuestDriverTrait(p.DriverBranch))
		}
	}
	if n := len(base.ExtraSpecs); n > 0 {
		fmt.Fprintf(&b, " + the %d extra spec(s) of %s", n, base.Name)
	}
	return b.String()
}
