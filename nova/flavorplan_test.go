package nova_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

func TestPlannedFlavorName(t *testing.T) {
	for _, tc := range []struct{ base, profile, want string }{
		{"m1.small", "T4-4Q", "m1.small.vgpu-t4-4q"},
		{"c2 r4", "A100-1-5C", "c2 r4.vgpu-a100-1-5c"},
		{"x", "GRID T4/4Q", "x.vgpu-grid-t4-4q"},
	} {
		if got := nova.PlannedFlavorName(tc.base, tc.profile); got != tc.want {
			t.Errorf("PlannedFlavorName(%q, %q) = %q, want %q", tc.base, tc.profile, got, tc.want)
		}
	}
	for _, tc := range []struct {
		base, profile string
		branch        int
		want          string
	}{
		{"m1.small", "T4-4Q", 550, "m1.small.vgpu-t4-4q-r550"},
		{"M1.Small", "GRID T4/4Q", 535, "M1.Small.vgpu-grid-t4-4q-r535"},
		{"m1.small", "T4-4Q", 0, "m1.small.vgpu-t4-4q"},
	} {
		if got := nova.PlannedBranchFlavorName(tc.base, tc.profile, tc.branch); got != tc.want {
			t.Errorf("PlannedBranchFlavorName(%q, %q, %d) = %q, want %q", tc.base, tc.profile, tc.branch, got, tc.want)
		}
	}
	if got := nova.GuestDriverTrait(550); got != "CUSTOM_VGPU_GUEST_DRIVER_R550" {
		t.Errorf("GuestDriverTrait(550) = %q", got)
	}
}

// row is what a test compares of a proposal.
type row struct {
	name, basedOn, profile string
	action                 nova.PlanAction
	existing               string
}

func rows(p nova.FlavorPlan) []row {
	out := []row{}
	for _, x := range p.Proposals {
		out = append(out, row{x.Flavor.Name, x.BasedOn, x.Profile, x.Action, x.Existing})
	}
	return out
}

func vgpuSpecs(trait string, more ...string) map[string]string {
	m := map[string]string{"resources1:VGPU": "1", "trait1:" + trait: "required", "trait1:" + nova.GPUFaultTrait: "forbidden"}
	for i := 0; i+1 < len(more); i += 2 {
		m[more[i]] = more[i+1]
	}
	return m
}

func TestPlanFlavors(t *testing.T) {
	t44 := nova.PlanProfile{Name: "T4-4Q", TypeID: "nvidia-232", Trait: "CUSTOM_NVIDIA_232"}
	t42 := nova.PlanProfile{Name: "T4-2Q", TypeID: "nvidia-231", Trait: "CUSTOM_NVIDIA_231"}
	// T4-4Q for guests with a 550 driver.
	t44r550 := t44
	t44r550.DriverBranch = 550
	r550 := "trait1:CUSTOM_VGPU_GUEST_DRIVER_R550"
	small := nova.PlanFlavor{ID: "1", Name: "m1.small", VCPUs: 2, RAM: 2048, Disk: 20, Public: true}
	large := nova.PlanFlavor{ID: "2", Name: "m1.large", VCPUs: 8, RAM: 16384, Disk: 80, Ephemeral: 10, Swap: 512, Public: true,
		ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	// Equal to m1.small's T4-4Q proposal.
	same := func(name, id string, mod ...func(*nova.PlanFlavor)) nova.PlanFlavor {
		f := nova.PlanFlavor{ID: id, Name: name, VCPUs: 2, RAM: 2048, Disk: 20, Public: true, ExtraSpecs: vgpuSpecs("CUSTOM_NVIDIA_232")}
		for _, m := range mod {
			m(&f)
		}
		return f
	}

	for _, tc := range []struct {
		name     string
		flavors  []nova.PlanFlavor
		profiles []nova.PlanProfile
		want     []row
		skipped  []nova.PlanSkip
		base     func(nova.PlanFlavor) bool
		check    func(t *testing.T, p nova.FlavorPlan)
	}{
		{
			name:     "create, sorted by flavor then profile",
			flavors:  []nova.PlanFlavor{small, large},
			profiles: []nova.PlanProfile{t44, t42},
			want: []row{
				{"m1.large.vgpu-t4-2q", "m1.large", "T4-2Q", nova.PlanCreate, ""},
				{"m1.large.vgpu-t4-4q", "m1.large", "T4-4Q", nova.PlanCreate, ""},
				{"m1.small.vgpu-t4-2q", "m1.small", "T4-2Q", nova.PlanCreate, ""},
				{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanCreate, ""},
			},
			check: func(t *testing.T, p nova.FlavorPlan) {
				got := p.Proposals[1].Flavor
				want := nova.PlanFlavor{Name: "m1.large.vgpu-t4-4q", VCPUs: 8, RAM: 16384, Disk: 80, Ephemeral: 10, Swap: 512, Public: true,
					ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated", "resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required",
						"trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT": "forbidden"}}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("proposal %+v\nwant     %+v", got, want)
				}
				if d := p.Proposals[1].Detail; d != "vcpus=8 ram=16384 disk=80 ephemeral=10 swap=512 + resources1:VGPU=1 trait1:CUSTOM_NVIDIA_232=required trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden + the 1 extra spec(s) of m1.large" {
					t.Errorf("detail %q", d)
				}
				if large.ExtraSpecs["resources:VGPU"] != "" {
					t.Error("the base's extra specs were modified")
				}
			},
		},
		{
			name:     "exists",
			flavors:  []nova.PlanFlavor{small, same("m1.small.vgpu-t4-4q", "9")},
			profiles: []nova.PlanProfile{t44},
			want:     []row{{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanExists, "m1.small.vgpu-t4-4q"}},
			skipped:  []nova.PlanSkip{{Flavor: "m1.small.vgpu-t4-4q", Reason: "asks for a vGPU already", VGPU: true}},
		},
		{
			name:     "covered by a flavor of another name",
			flavors:  []nova.PlanFlavor{small, same("g1.small", "7")},
			profiles: []nova.PlanProfile{t44, t42},
			want: []row{
				{"m1.small.vgpu-t4-2q", "m1.small", "T4-2Q", nova.PlanCreate, ""},
				{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanCovered, "g1.small"},
			},
			skipped: []nova.PlanSkip{{Flavor: "g1.small", Reason: "asks for a vGPU already", VGPU: true}},
			check: func(t *testing.T, p nova.FlavorPlan) {
				if p.Proposals[1].ExistingID != "7" || !strings.Contains(p.Proposals[1].Detail, "g1.small") {
					t.Errorf("covered proposal %+v", p.Proposals[1])
				}
			},
		},
		{
			name: "covered by a flavor the plan creates",
			flavors: []nova.PlanFlavor{small, {ID: "3", Name: "a.small", VCPUs: 2, RAM: 2048, Disk: 20, Public: true,
				ExtraSpecs: map[string]string{}}},
			profiles: []nova.PlanProfile{t44},
			want: []row{
				{"a.small.vgpu-t4-4q", "a.small", "T4-4Q", nova.PlanCreate, ""},
				{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanCovered, "a.small.vgpu-t4-4q"},
			},
			check: func(t *testing.T, p nova.FlavorPlan) {
				if p.Proposals[1].ExistingID != "" || !strings.Contains(p.Proposals[1].Detail, "which this plan creates") {
					t.Errorf("covered proposal %+v", p.Proposals[1])
				}
			},
		},
		{
			name: "conflict: same name, other contents",
			flavors: []nova.PlanFlavor{small, same("m1.small.vgpu-t4-4q", "9", func(f *nova.PlanFlavor) {
				f.RAM, f.Public = 4096, false
				f.ExtraSpecs = map[string]string{"resources:VGPU": "2", "hw:mem_page_size": "large"}
			})},
			profiles: []nova.PlanProfile{t44},
			want:     []row{{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanConflict, "m1.small.vgpu-t4-4q"}},
			skipped:  []nova.PlanSkip{{Flavor: "m1.small.vgpu-t4-4q", Reason: "asks for a vGPU already", VGPU: true}},
			check: func(t *testing.T, p nova.FlavorPlan) {
				want := []string{"ram 4096, planned 2048", "is_public false, planned true", "extra spec resources1:VGPU missing",
					"extra spec trait1:CUSTOM_NVIDIA_232 missing", "extra spec trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT missing",
					"extra spec hw:mem_page_size=large not planned", "extra spec resources:VGPU=2 not planned"}
				if got := p.Proposals[0].Differences; !reflect.DeepEqual(got, want) {
					t.Errorf("differences %q\nwant        %q", got, want)
				}
				if d := p.Proposals[0].Detail; !strings.HasPrefix(d, "left alone: ram 4096, planned 2048; ") {
					t.Errorf("detail %q", d)
				}
			},
		},
		{
			name:     "conflict with a flavor without vGPU of the name",
			flavors:  []nova.PlanFlavor{small, {ID: "5", Name: "m1.small.vgpu-t4-4q", VCPUs: 2, RAM: 2048, Disk: 20, Public: true}},
			profiles: []nova.PlanProfile{t44},
			// The flavor of the planned name is a base itself.
			want: []row{
				{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanConflict, "m1.small.vgpu-t4-4q"},
				{"m1.small.vgpu-t4-4q.vgpu-t4-4q", "m1.small.vgpu-t4-4q", "T4-4Q", nova.PlanCreate, ""},
			},
		},
		{
			name:     "the existing flavor's nil specs equal empty ones",
			flavors:  []nova.PlanFlavor{{ID: "1", Name: "a", VCPUs: 1, RAM: 512, Disk: 1, ExtraSpecs: map[string]string{}}, {ID: "2", Name: "b", VCPUs: 1, RAM: 512, Disk: 1}},
			profiles: []nova.PlanProfile{t44},
			want: []row{
				{"a.vgpu-t4-4q", "a", "T4-4Q", nova.PlanCreate, ""},
				{"b.vgpu-t4-4q", "b", "T4-4Q", nova.PlanCovered, "a.vgpu-t4-4q"},
			},
			check: func(t *testing.T, p nova.FlavorPlan) {
				if !strings.Contains(p.Proposals[0].Detail, "private like a") {
					t.Errorf("detail of a private base's proposal %q", p.Proposals[0].Detail)
				}
			},
		},
		{
			name: "flavors with vGPUs and malformed specs are skipped",
			flavors: []nova.PlanFlavor{
				small,
				{ID: "10", Name: "vgpu.granular", VCPUs: 2, RAM: 2048, Disk: 20, ExtraSpecs: map[string]string{"resources1:VGPU": "2"}},
				{ID: "11", Name: "mdev.class", VCPUs: 2, RAM: 2048, Disk: 20, ExtraSpecs: map[string]string{"resources:CUSTOM_NVIDIA_T4_4Q": "1"}},
				{ID: "12", Name: "bad.amount", VCPUs: 2, RAM: 2048, Disk: 20, ExtraSpecs: map[string]string{"resources:VGPU": "one"}},
				{ID: "13", Name: "bad.trait", VCPUs: 2, RAM: 2048, Disk: 20, ExtraSpecs: map[string]string{"trait:HW_CPU_X86_AVX2": "yes"}},
				{ID: "14", Name: "zero.vgpu", VCPUs: 1, RAM: 1024, Disk: 5, ExtraSpecs: map[string]string{"resources:VGPU": "0"}},
			},
			profiles: []nova.PlanProfile{t44},
			want: []row{
				{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanCreate, ""},
				// resources:VGPU=0 asks for none (as in Nova): a base; the plan's 1 replaces the 0.
				{"zero.vgpu.vgpu-t4-4q", "zero.vgpu", "T4-4Q", nova.PlanCreate, ""},
			},
			skipped: []nova.PlanSkip{
				{Flavor: "bad.amount", Reason: `extra spec "resources:VGPU"="one": amount must be a non-negative integer`},
				{Flavor: "bad.trait", Reason: `extra spec "trait:HW_CPU_X86_AVX2"="yes": want "required" or "forbidden"`},
				{Flavor: "mdev.class", Reason: "asks for a vGPU already", VGPU: true},
				{Flavor: "vgpu.granular", Reason: "asks for a vGPU already", VGPU: true},
			},
			check: func(t *testing.T, p nova.FlavorPlan) {
				if v, ok := p.Proposals[1].Flavor.ExtraSpecs["resources:VGPU"]; ok || p.Proposals[1].Flavor.ExtraSpecs["resources1:VGPU"] != "1" {
					t.Errorf("zero.vgpu's proposal: resources:VGPU = %q (want none), resources1:VGPU = %q (want 1)", v,
						p.Proposals[1].Flavor.ExtraSpecs["resources1:VGPU"])
				}
			},
		},
		{
			name:    "profiles without a valid trait are skipped, duplicates once",
			flavors: []nova.PlanFlavor{small},
			profiles: []nova.PlanProfile{t44, {Name: "T4-8Q", TypeID: ""}, {Name: "X-1", Trait: "custom_lower"}, t44,
				{Name: "T4-4Q", Trait: "CUSTOM_NVIDIA_999"}},
			want: []row{{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanCreate, ""}},
			skipped: []nova.PlanSkip{
				{Profile: "T4-8Q", Reason: "no trait: the profile's type id is not known yet"},
				{Profile: "X-1", Reason: `trait "custom_lower": want upper case letters, digits and '_' (e.g. VGPU or CUSTOM_NVIDIA_232)`},
			},
			check: func(t *testing.T, p nova.FlavorPlan) {
				if p.Proposals[0].Trait != "CUSTOM_NVIDIA_232" {
					t.Errorf("trait %s: the first of a duplicated profile wins", p.Proposals[0].Trait)
				}
			},
		},
		{
			name:     "a name too long for Nova",
			flavors:  []nova.PlanFlavor{{ID: "1", Name: strings.Repeat("n", 250), VCPUs: 1, RAM: 1, Disk: 1}},
			profiles: []nova.PlanProfile{t44},
			want:     []row{},
			check: func(t *testing.T, p nova.FlavorPlan) {
				if len(p.Skipped) != 1 || p.Skipped[0].Profile != "T4-4Q" || !strings.Contains(p.Skipped[0].Reason, "longer than Nova's 255") {
					t.Errorf("skipped %+v", p.Skipped)
				}
			},
		},
		{
			name: "only the chosen bases, against every flavor",
			flavors: []nova.PlanFlavor{small, large, same("g1.small", "7"),
				{ID: "8", Name: "m1.large.vgpu-t4-4q", VCPUs: 1, RAM: 1, Disk: 1, ExtraSpecs: vgpuSpecs("CUSTOM_NVIDIA_232")},
				{ID: "9", Name: "m1.bad", ExtraSpecs: map[string]string{"group_policy": "all"}},
				{ID: "10", Name: "other.bad", ExtraSpecs: map[string]string{"group_policy": "all"}}},
			profiles: []nova.PlanProfile{t44},
			base: func(f nova.PlanFlavor) bool {
				return strings.HasPrefix(f.Name, "m1.") && !strings.Contains(f.Name, ".vgpu-")
			},
			want: []row{
				{"m1.large.vgpu-t4-4q", "m1.large", "T4-4Q", nova.PlanConflict, "m1.large.vgpu-t4-4q"},
				{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanCovered, "g1.small"},
			},
			skipped: []nova.PlanSkip{{Flavor: "m1.bad", Reason: `extra spec "group_policy"="all": want "none" or "isolate"`}},
		},
		{
			name:     "driver branch: the name's suffix and the trait in the VGPU's group",
			flavors:  []nova.PlanFlavor{small, large},
			profiles: []nova.PlanProfile{t44r550},
			want: []row{
				{"m1.large.vgpu-t4-4q-r550", "m1.large", "T4-4Q", nova.PlanCreate, ""},
				{"m1.small.vgpu-t4-4q-r550", "m1.small", "T4-4Q", nova.PlanCreate, ""},
			},
			check: func(t *testing.T, p nova.FlavorPlan) {
				got := p.Proposals[1]
				if want := vgpuSpecs("CUSTOM_NVIDIA_232", r550, "required"); !reflect.DeepEqual(got.Flavor.ExtraSpecs, want) {
					t.Errorf("extra specs %v\nwant        %v", got.Flavor.ExtraSpecs, want)
				}
				if got.DriverBranch != 550 {
					t.Errorf("driver branch %d, want 550", got.DriverBranch)
				}
				if want := "vcpus=2 ram=2048 disk=20 + resources1:VGPU=1 trait1:CUSTOM_NVIDIA_232=required trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden " +
					r550 + "=required"; got.Detail != want {
					t.Errorf("detail %q\nwant   %q", got.Detail, want)
				}
				b, _ := json.Marshal(got)
				if !strings.Contains(string(b), `"driver_branch":550`) {
					t.Errorf("JSON %s lacks driver_branch", b)
				}
			},
		},
		{
			name:     "driver branch: the flavor without a branch does not cover it",
			flavors:  []nova.PlanFlavor{small, same("g1.small", "7"), same("m1.small.vgpu-t4-4q", "8")},
			profiles: []nova.PlanProfile{t44r550},
			want:     []row{{"m1.small.vgpu-t4-4q-r550", "m1.small", "T4-4Q", nova.PlanCreate, ""}},
		},
		{
			name: "driver branch: covered by a flavor with the trait, exists under its name",
			flavors: []nova.PlanFlavor{small, same("g1.small.r550", "7", func(f *nova.PlanFlavor) { f.ExtraSpecs[r550] = "required" }),
				{ID: "3", Name: "a.small", VCPUs: 2, RAM: 2048, Disk: 20, Public: true},
				same("a.small.vgpu-t4-4q-r550", "9", func(f *nova.PlanFlavor) { f.ExtraSpecs[r550] = "required" })},
			profiles: []nova.PlanProfile{t44r550},
			want: []row{
				{"a.small.vgpu-t4-4q-r550", "a.small", "T4-4Q", nova.PlanExists, "a.small.vgpu-t4-4q-r550"},
				{"m1.small.vgpu-t4-4q-r550", "m1.small", "T4-4Q", nova.PlanCovered, "a.small.vgpu-t4-4q-r550"},
			},
		},
		{
			name: "driver branch: a flavor of the name without the trait conflicts",
			flavors: []nova.PlanFlavor{small, same("m1.small.vgpu-t4-4q-r550", "9"),
				same("m1.small.vgpu-t4-4q-r535", "10", func(f *nova.PlanFlavor) { f.ExtraSpecs["trait1:CUSTOM_VGPU_GUEST_DRIVER_R535"] = "required" })},
			profiles: []nova.PlanProfile{t44r550},
			want:     []row{{"m1.small.vgpu-t4-4q-r550", "m1.small", "T4-4Q", nova.PlanConflict, "m1.small.vgpu-t4-4q-r550"}},
			check: func(t *testing.T, p nova.FlavorPlan) {
				if got, want := p.Proposals[0].Differences, []string{"extra spec " + r550 + " missing"}; !reflect.DeepEqual(got, want) {
					t.Errorf("differences %q, want %q", got, want)
				}
			},
		},
		{
			name:     "without a branch, a flavor with the trait neither covers nor is the plan's",
			flavors:  []nova.PlanFlavor{small, same("g1.small.r550", "7", func(f *nova.PlanFlavor) { f.ExtraSpecs[r550] = "required" })},
			profiles: []nova.PlanProfile{t44},
			want:     []row{{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanCreate, ""}},
		},
		{
			name:    "driver branch: out of range, or with an alias, skips the profile",
			flavors: []nova.PlanFlavor{small},
			profiles: []nova.PlanProfile{{Name: "A", Trait: "CUSTOM_A", DriverBranch: 10000}, {Name: "B", Trait: "CUSTOM_B", DriverBranch: -1},
				{Name: "V", Alias: "v", DriverBranch: 550}, t44r550},
			want: []row{{"m1.small.vgpu-t4-4q-r550", "m1.small", "T4-4Q", nova.PlanCreate, ""}},
			skipped: []nova.PlanSkip{
				{Profile: "A", Reason: "driver branch 10000: want 1 to 9999"},
				{Profile: "B", Reason: "driver branch -1: want 1 to 9999"},
				{Profile: "V", Reason: "driver branch 550: a Nova-owned VF's PCI request (pci_passthrough:alias) carries no trait, so its flavors cannot require a guest driver branch"},
			},
		},
		{
			name:     "nothing to plan",
			flavors:  nil,
			profiles: []nova.PlanProfile{t44},
			want:     []row{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := nova.PlanFlavors(tc.flavors, tc.profiles, tc.base)
			if got := rows(p); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("proposals\n%v\nwant\n%v", got, tc.want)
			}
			if tc.skipped != nil && !reflect.DeepEqual(p.Skipped, tc.skipped) {
				t.Errorf("skipped\n%+v\nwant\n%+v", p.Skipped, tc.skipped)
			}
			if tc.check != nil && len(p.Proposals) == len(tc.want) {
				tc.check(t, p)
			}
			// Deterministic: the same plan from the inputs reversed.
			rf := make([]nova.PlanFlavor, len(tc.flavors))
			for i, f := range tc.flavors {
				rf[len(rf)-1-i] = f
			}
			again := nova.PlanFlavors(rf, tc.profiles, tc.base)
			a, _ := json.Marshal(p)
			b, _ := json.Marshal(again)
			if string(a) != string(b) {
				t.Errorf("the plan depends on the order of the flavors:\n%s\n%s", a, b)
			}
		})
	}
}

// TestPlanFlavorsApplied: once the creates exist, the same plan shows them
// as exists and changes nothing else.
func TestPlanFlavorsApplied(t *testing.T) {
	flavors := []nova.PlanFlavor{
		{ID: "1", Name: "m1.small", VCPUs: 2, RAM: 2048, Disk: 20, Public: true},
		{ID: "2", Name: "m2.small", VCPUs: 2, RAM: 2048, Disk: 20, Public: true},
	}
	profiles := []nova.PlanProfile{{Name: "T4-4Q", Trait: "CUSTOM_NVIDIA_232"}}
	p := nova.PlanFlavors(flavors, profiles, nil)
	for i, x := range p.Proposals {
		if x.Action == nova.PlanCreate {
			f := x.Flavor
			f.ID = "new" + string(rune('0'+i))
			flavors = append(flavors, f)
		}
	}
	got := rows(nova.PlanFlavors(flavors, profiles, nil))
	want := []row{
		{"m1.small.vgpu-t4-4q", "m1.small", "T4-4Q", nova.PlanExists, "m1.small.vgpu-t4-4q"},
		{"m2.small.vgpu-t4-4q", "m2.small", "T4-4Q", nova.PlanCovered, "m1.small.vgpu-t4-4q"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after applying\n%v\nwant\n%v", got, want)
	}
}
