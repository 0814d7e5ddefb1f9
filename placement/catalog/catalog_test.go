package catalog

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestParseName(t *testing.T) {
	tests := []struct {
		in   string
		want ParsedName
	}{
		{"GRID T4-4Q", ParsedName{Name: "T4-4Q", GPU: "T4", FramebufferMiB: 4096, Series: SeriesQ}},
		{"T4-4Q", ParsedName{Name: "T4-4Q", GPU: "T4", FramebufferMiB: 4096, Series: SeriesQ}},
		{"t4-16q", ParsedName{Name: "T4-16Q", GPU: "T4", FramebufferMiB: 16384, Series: SeriesQ}},
		{"NVIDIA A40-2Q", ParsedName{Name: "A40-2Q", GPU: "A40", FramebufferMiB: 2048, Series: SeriesQ}},
		{"NVIDIA H200X-141C", ParsedName{Name: "H200X-141C", GPU: "H200X", FramebufferMiB: 141 * 1024, Series: SeriesC}},
		{"GRID M60-0B", ParsedName{Name: "M60-0B", GPU: "M60", FramebufferMiB: 512, Series: SeriesB}},
		{"GRID M60-8Q", ParsedName{Name: "M60-8Q", GPU: "M60", FramebufferMiB: 8192, Series: SeriesQ}},
		{"A100-4-20C", ParsedName{Name: "A100-4-20C", GPU: "A100", FramebufferMiB: 20480, Series: SeriesC, MIGSlices: 4}},
		{"NVIDIA A100-1-5CME", ParsedName{Name: "A100-1-5CME", GPU: "A100", FramebufferMiB: 5120, Series: SeriesC, MIGSlices: 1, Suffix: "ME"}},
		{"GRID T4-2B4", ParsedName{Name: "T4-2B4", GPU: "T4", FramebufferMiB: 2048, Series: SeriesB, Suffix: "4"}},
		{"GRID RTX6000-4Q", ParsedName{Name: "RTX6000-4Q", GPU: "RTX6000", FramebufferMiB: 4096, Series: SeriesQ}},
		{"  grid  T4-8A ", ParsedName{Name: "T4-8A", GPU: "T4", FramebufferMiB: 8192, Series: SeriesA}},
	}
	for _, tt := range tests {
		got, err := ParseName(tt.in)
		if err != nil {
			t.Errorf("ParseName(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseName(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestParseNameErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "empty"},
		{"GRID ", "want GPU-"},
		{" \t", "empty"},
		{"T4", "want GPU-"},
		{"-4Q", "no GPU model"},
		{"T 4-4Q", "character ' '"},
		{"T4-Q", "does not start with the framebuffer"},
		{"T4-4", "no series letter"},
		{"T4-4X", "series \"X\""},
		{"T4-4QZ", "unknown suffix"},
		{"A100-9-20C", "MIG slice count"},
		{"A100-0-0C", "MIG slice count"},
		{"A100-1-0C", "cannot have 0 GiB"},
		{"T4-99999Q", "implausible"},
		{"a-b-c-d", "want GPU-"},
		{strings.Repeat("A", 70) + "-4Q", "longer than 64"},
	}
	for _, tt := range tests {
		_, err := ParseName(tt.in)
		var ne *NameError
		if !errors.As(err, &ne) {
			t.Errorf("ParseName(%q) error = %v, want a *NameError", tt.in, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseName(%q) error = %q, want it to contain %q", tt.in, err, tt.want)
		}
	}
}

func TestTraitFor(t *testing.T) {
	tests := []struct{ in, want string }{
		{"nvidia-232", "CUSTOM_NVIDIA_232"},
		{"nvidia-11", "CUSTOM_NVIDIA_11"},
		{"1428", "CUSTOM_1428"},
		{"i915-GVTg_V5_8", "CUSTOM_I915_GVTG_V5_8"},
		{"a--b..c", "CUSTOM_A_B_C"},
	}
	for _, tt := range tests {
		if got := TraitFor(tt.in); got != tt.want {
			t.Errorf("TraitFor(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestLoadSeed(t *testing.T) {
	c, err := LoadFile("testdata/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, ok := c.ByName("GRID T4-4Q")
	if !ok {
		t.Fatal("T4-4Q not in seed")
	}
	want := Profile{Name: "T4-4Q", TypeID: "nvidia-232", Trait: "CUSTOM_NVIDIA_232", FramebufferMiB: 4096, MaxInstances: 4, Series: SeriesQ, GPU: "T4", Source: SourceSeed}
	if p != want {
		t.Errorf("T4-4Q = %+v, want %+v", p, want)
	}
	if got, _ := c.ByTrait("CUSTOM_NVIDIA_232"); got.Name != "T4-4Q" {
		t.Errorf("ByTrait(CUSTOM_NVIDIA_232) = %+v", got)
	}
	if got, _ := c.ByTypeID("nvidia-558"); got.Name != "A40-2Q" || got.MaxInstances != 24 {
		t.Errorf("ByTypeID(nvidia-558) = %+v", got)
	}
	if got, _ := c.ByTypeID("nvidia-11"); got.Name != "M60-0B" || got.FramebufferMiB != 512 {
		t.Errorf("ByTypeID(nvidia-11) = %+v", got)
	}
	if p, ok := c.ByName("H200X-141C"); !ok || p.TypeID != "" || p.Series != SeriesC {
		t.Errorf("H200X-141C = %+v, %v", p, ok)
	}
	ps := c.Profiles()
	if len(ps) != c.Len() || len(ps) < 30 {
		t.Errorf("Profiles() has %d entries, Len %d", len(ps), c.Len())
	}
	for i := 1; i < len(ps); i++ {
		if ps[i-1].GPU > ps[i].GPU {
			t.Fatalf("Profiles() not sorted: %s before %s", ps[i-1].Name, ps[i].Name)
		}
	}
}

func TestSeedFileInEtcMatchesTestdata(t *testing.T) {
	a, err := os.ReadFile("../../etc/vgpu-bridge/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("testdata/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Error("testdata/profiles.yaml differs from etc/vgpu-bridge/profiles.yaml; copy it again")
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"not a mapping", "- a\n", []string{"1:1: want a mapping"}},
		{"unknown top key", "profile: []\n", []string{"1:1: unknown key \"profile\""}},
		{"syntax", "profiles: [\n", []string{"1:1: did not find expected node content"}},
		{"list", "profiles: 3\n", []string{"1:11: \"profiles\" must be a list"}},
		{"bad name", "profiles:\n  - name: T4-4X\n    type_id: nvidia-1\n", []string{"2:11: vGPU profile name \"T4-4X\": series"}},
		{"no name", "profiles:\n  - type_id: nvidia-1\n", []string{"2:5: profile without a name"}},
		{"bad max", "profiles:\n  - {name: T4-4Q, max_instances: lots}\n", []string{"2:34: max_instances \"lots\""}},
		{"bad type id", "profiles:\n  - {name: T4-4Q, type_id: \"a b\"}\n", []string{"2:28: type id \"a b\""}},
		{"dup name", "profiles:\n  - {name: T4-4Q}\n  - {name: GRID T4-4Q}\n", []string{"3:12: profile T4-4Q already defined at 2:12"}},
		{"dup type", "profiles:\n  - {name: T4-4Q, type_id: x}\n  - {name: T4-8Q, type_id: x}\n", []string{"3:28: type id x already used at 2:28"}},
		{"two errors", "profiles:\n  - {name: nope}\n  - {name: T4-4Q, colour: red}\n", []string{"2:12:", "3:19: unknown key \"colour\""}},
		{"nested", "profiles:\n  - {name: [a]}\n", []string{"2:12: name must be a scalar"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(strings.NewReader(tt.doc))
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error = %v, want *LoadError", err)
			}
			if len(le.Errors) != len(tt.want) {
				t.Fatalf("errors = %q, want %d", err, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(le.Errors[i].Error(), w) {
					t.Errorf("error %d = %q, want prefix %q", i, le.Errors[i].Error(), w)
				}
			}
		})
	}
}

func TestLoadEmpty(t *testing.T) {
	for _, doc := range []string{"", "profiles:\n", "# nothing\n"} {
		c, err := Load(strings.NewReader(doc))
		if err != nil || c.Len() != 0 {
			t.Errorf("Load(%q) = %v, %v", doc, c, err)
		}
	}
}

func TestObserveOverridesSeed(t *testing.T) {
	c, err := LoadFile("testdata/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Another driver branch calls T4-4Q nvidia-222 (type ids vary by driver).
	p, err := c.Observe("nvidia-222", "GRID T4-4Q", 4)
	if err != nil {
		t.Fatal(err)
	}
	if p.Source != SourceReport || p.Trait != "CUSTOM_NVIDIA_222" {
		t.Errorf("Observe = %+v", p)
	}
	if got, _ := c.ByName("T4-4Q"); got.TypeID != "nvidia-222" {
		t.Errorf("ByName(T4-4Q) = %+v, want type nvidia-222", got)
	}
	if got, _ := c.ByTypeID("nvidia-222"); got.Name != "T4-4Q" {
		t.Errorf("ByTypeID(nvidia-222) = %+v", got)
	}
	// T4-1B lost its id: nvidia-222 now means T4-4Q on this fleet.
	if got, _ := c.ByName("T4-1B"); got.TypeID != "" {
		t.Errorf("ByName(T4-1B) = %+v, want no type id", got)
	}
	// The old id still resolves to what the seed said until a report changes it.
	if got, _ := c.ByTypeID("nvidia-232"); got.Name != "T4-4Q" {
		t.Errorf("ByTypeID(nvidia-232) = %+v", got)
	}
	// An id learnt for a name-only seed entry.
	if _, err := c.Observe("1428", "NVIDIA H200X-141C", 1); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.ByTrait("CUSTOM_1428"); got.Name != "H200X-141C" {
		t.Errorf("ByTrait(CUSTOM_1428) = %+v", got)
	}
	if _, err := c.Observe("", "T4-4Q", 1); err == nil {
		t.Error("Observe with empty type id: no error")
	}
	if _, err := c.Observe("x", "garbage", 1); err == nil {
		t.Error("Observe with garbage name: no error")
	}
}

func TestMerge(t *testing.T) {
	a := New()
	if err := a.Add(Profile{Name: "T4-4Q", TypeID: "nvidia-232", MaxInstances: 4}); err != nil {
		t.Fatal(err)
	}
	b := New()
	if _, err := b.Observe("nvidia-999", "GRID T4-8Q", 2); err != nil {
		t.Fatal(err)
	}
	a.Merge(b)
	if got, ok := a.ByTrait("CUSTOM_NVIDIA_999"); !ok || got.Name != "T4-8Q" {
		t.Errorf("after Merge ByTrait = %+v %v", got, ok)
	}
	if got, _ := a.ByTrait("CUSTOM_NVIDIA_232"); got.Name != "T4-4Q" {
		t.Errorf("Add did not derive the trait: %+v", got)
	}
	if a.Len() != 2 {
		t.Errorf("Len = %d", a.Len())
	}
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"GRID T4-4Q", "NVIDIA A40-2Q", "NVIDIA H200X-141C", "GRID M60-0B", "A100-4-20C", "T4-2B4", "A100-1-5CME", "", "-", "T4--4Q"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseName(s)
		if err != nil {
			return
		}
		if !p.Series.Valid() || p.FramebufferMiB <= 0 || p.GPU == "" {
			t.Fatalf("ParseName(%q) = %+v", s, p)
		}
		q, err := ParseName(p.Name)
		if err != nil || q != p {
			t.Fatalf("round trip of %q: %+v, %v; first %+v", s, q, err, p)
		}
	})
}

func FuzzLoad(f *testing.F) {
	seed, err := os.ReadFile("testdata/profiles.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(seed))
	f.Add("profiles:\n  - {name: T4-4Q, type_id: nvidia-232, max_instances: 4}\n")
	f.Add("profiles: [{name: x}]")
	f.Add("&a [*a]")
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := Load(strings.NewReader(doc))
		if err != nil {
			var le *LoadError
			if errors.As(err, &le) && len(le.Errors) == 0 {
				t.Fatal("LoadError without errors")
			}
			return
		}
		for _, p := range c.Profiles() {
			if p.TypeID != "" && p.Trait != TraitFor(p.TypeID) {
				t.Fatalf("profile %+v: trait mismatch", p)
			}
		}
	})
}

// TestObserveKeepsMdevTypeID: an agent that reports NVML's numeric type ids
// ("230") for an mdev GPU must not re-key a profile known by its mdev type id
// ("nvidia-230"): the trait stays CUSTOM_ + the mdev id.
func TestObserveKeepsMdevTypeID(t *testing.T) {
	type obs struct{ typeID, name string }
	tests := []struct {
		name      string
		seed      string // profiles document
		observe   []obs
		profile   string
		wantType  string
		wantTrait string
		// alias, when set, is a type id that must resolve to profile
		// (ByTypeID and ByTrait) without being its type id.
		alias string
	}{
		{"numeric after seeded mdev id", "profiles: [{name: T4-1Q, type_id: nvidia-230, max_instances: 16}]",
			[]obs{{"230", "GRID T4-1Q"}}, "T4-1Q", "nvidia-230", "CUSTOM_NVIDIA_230", "230"},
		{"numeric after reported mdev id", "",
			[]obs{{"nvidia-230", "GRID T4-1Q"}, {"230", "GRID T4-1Q"}}, "T4-1Q", "nvidia-230", "CUSTOM_NVIDIA_230", "230"},
		{"mdev, numeric, mdev", "",
			[]obs{{"nvidia-230", "GRID T4-1Q"}, {"230", "GRID T4-1Q"}, {"nvidia-230", "GRID T4-1Q"}, {"230", "GRID T4-1Q"}},
			"T4-1Q", "nvidia-230", "CUSTOM_NVIDIA_230", "230"},
		{"numeric for another name keeps both mdev ids", "profiles: [{name: T4-1Q, type_id: nvidia-230}, {name: T4-2Q, type_id: nvidia-231}]",
			[]obs{{"230", "GRID T4-2Q"}}, "T4-2Q", "nvidia-231", "CUSTOM_NVIDIA_231", "230"},
		{"mdev id replaces a numeric one", "",
			[]obs{{"230", "GRID T4-1Q"}, {"nvidia-230", "GRID T4-1Q"}}, "T4-1Q", "nvidia-230", "CUSTOM_NVIDIA_230", "230"},
		{"numeric learnt for a name-only seed", "profiles: [{name: H200X-141C}]",
			[]obs{{"1428", "NVIDIA H200X-141C"}}, "H200X-141C", "1428", "CUSTOM_1428", ""},
		{"numeric replaces numeric (new driver)", "profiles: [{name: H200X-141C, type_id: \"1428\"}]",
			[]obs{{"1500", "NVIDIA H200X-141C"}}, "H200X-141C", "1500", "CUSTOM_1500", ""},
		{"mdev replaces mdev (new driver)", "profiles: [{name: T4-4Q, type_id: nvidia-232}]",
			[]obs{{"nvidia-222", "GRID T4-4Q"}, {"222", "GRID T4-4Q"}}, "T4-4Q", "nvidia-222", "CUSTOM_NVIDIA_222", "222"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(strings.NewReader(tc.seed))
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range tc.observe {
				if _, err := c.Observe(o.typeID, o.name, 0); err != nil {
					t.Fatalf("Observe(%s, %s): %v", o.typeID, o.name, err)
				}
			}
			got, ok := c.ByName(tc.profile)
			if !ok || got.TypeID != tc.wantType || got.Trait != tc.wantTrait {
				t.Errorf("ByName(%s) = %+v, %v; want type %s trait %s", tc.profile, got, ok, tc.wantType, tc.wantTrait)
			}
			if p, ok := c.ByTrait(tc.wantTrait); !ok || p.Name != tc.profile {
				t.Errorf("ByTrait(%s) = %+v, %v; want %s", tc.wantTrait, p, ok, tc.profile)
			}
			if tc.alias != "" {
				if p, ok := c.ByTypeID(tc.alias); !ok || p.Name != tc.profile || p.Trait != TraitFor(tc.alias) {
					t.Errorf("ByTypeID(%s) = %+v, %v; want %s", tc.alias, p, ok, tc.profile)
				}
			}
			checkConsistent(t, c)
		})
	}
}

// checkConsistent: every profile's trait is CUSTOM_ + its type id, and its
// type id and trait lead back to it.
func checkConsistent(t *testing.T, c *Catalog) {
	t.Helper()
	for _, p := range c.Profiles() {
		if p.TypeID == "" {
			if p.Trait != "" {
				t.Errorf("%s: trait %s without a type id", p.Name, p.Trait)
			}
			continue
		}
		if p.Trait != TraitFor(p.TypeID) {
			t.Errorf("%s: trait %s for type %s", p.Name, p.Trait, p.TypeID)
		}
		if q, _ := c.ByTypeID(p.TypeID); q.Name != p.Name {
			t.Errorf("%s: ByTypeID(%s) = %s", p.Name, p.TypeID, q.Name)
		}
		if q, _ := c.ByTrait(p.Trait); q.Name != p.Name {
			t.Errorf("%s: ByTrait(%s) = %s", p.Name, p.Trait, q.Name)
		}
	}
}

func TestObserveSameReportKeepsVersion(t *testing.T) {
	c, err := LoadFile("testdata/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"nvidia-230", "230"} {
		if _, err := c.Observe(id, "GRID T4-1Q", 16); err != nil {
			t.Fatal(err)
		}
	}
	v := c.Version()
	for _, id := range []string{"nvidia-230", "230", "nvidia-230"} {
		if _, err := c.Observe(id, "GRID T4-1Q", 16); err != nil {
			t.Fatal(err)
		}
	}
	if c.Version() != v {
		t.Errorf("Version %d → %d after reports that changed nothing", v, c.Version())
	}
	if _, err := c.Observe("nvidia-230", "GRID T4-1Q", 8); err != nil {
		t.Fatal(err)
	}
	if c.Version() == v {
		t.Error("Version unchanged after max instances changed")
	}
}

func TestIsNumericTypeID(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{{"230", true}, {"1428", true}, {"nvidia-230", false}, {"", false}, {"23a", false}, {"-1", false}}
	for _, tt := range tests {
		if got := IsNumericTypeID(tt.in); got != tt.want {
			t.Errorf("IsNumericTypeID(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
