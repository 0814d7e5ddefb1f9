package placement

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// TestDriverTraitTargets: the compute node (root) of a host whose agent
// reports a driver version is a target once, beside its GPUs, unless it
// carries the branches already; a host that reports none is left alone.
func TestDriverTraitTargets(t *testing.T) {
	r535, r550 := GuestDriverTrait(535), GuestDriverTrait(550)
	cmp1 := &engine.Host{Name: "cmp1", RootUUID: "root1", Traits: []string{"COMPUTE_NODE", GuestDriverTrait(525)}}
	cmp2 := &engine.Host{Name: "cmp2", RootUUID: "root2", Traits: []string{"COMPUTE_NODE", r535, r550}}
	cmp3 := &engine.Host{Name: "cmp3", RootUUID: "root3", Traits: []string{"COMPUTE_NODE"}}
	gpus := []engine.GPU{
		{UUID: "g1a", Name: "cmp1_a", Host: cmp1},
		{UUID: "g1b", Name: "cmp1_b", Host: cmp1, Traits: []string{r535, r550}},
		{UUID: "g2", Name: "cmp2_a", Host: cmp2},
		{UUID: "g3", Name: "cmp3_a", Host: cmp3},
	}
	drivers := map[string]hostDriver{"cmp1": {"KVM", "550.54.16"}, "cmp2": {"KVM", "550.54.16"}}
	branches := func(hv, v string) []int { return []int{550, 535} }
	var got []string
	for _, p := range driverTraitTargets(gpus, drivers, branches) {
		if !slices.Equal(p.want, []string{r535, r550}) {
			t.Errorf("%s: want %v, want %v", p.name, p.want, []string{r535, r550})
		}
		got = append(got, p.uuid+map[bool]string{true: "(root)"}[p.root])
	}
	if want := []string{"g1a", "root1(root)", "g2"}; !slices.Equal(got, want) {
		t.Errorf("targets %v, want %v", got, want)
	}
}

// fakeTraits is a Placement holding the traits of providers, with their
// generations: GET and PUT /resource_providers/{uuid}/traits, PUT
// /traits/{name}.
type fakeTraits struct {
	mu       sync.Mutex
	traits   map[string][]string
	gen      map[string]int
	conflict bool // the next PUT of a provider's traits answers 409
	puts     int
}

func (f *fakeTraits) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/traits/") && r.Method == http.MethodPut {
		w.WriteHeader(http.StatusCreated)
		return
	}
	uuid := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/resource_providers/"), "/traits")
	type body struct {
		Gen    int      `json:"resource_provider_generation"`
		Traits []string `json:"traits"`
	}
	switch r.Method {
	case http.MethodGet:
		_ = json.NewEncoder(w).Encode(body{f.gen[uuid], f.traits[uuid]})
	case http.MethodPut:
		var in body
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if f.conflict || in.Gen != f.gen[uuid] {
			f.conflict = false
			http.Error(w, "generation", http.StatusConflict)
			return
		}
		f.puts++
		f.traits[uuid], f.gen[uuid] = in.Traits, f.gen[uuid]+1
		_ = json.NewEncoder(w).Encode(body{f.gen[uuid], f.traits[uuid]})
	}
}

// TestSetGuestDriverTraitsOnRoot: on a compute node provider the branch
// traits are added, the one of another branch removed, every other trait
// (Nova's own, another custom one) kept, with the provider's generation;
// a moved generation (409) writes nothing and the next round does.
func TestSetGuestDriverTraitsOnRoot(t *testing.T) {
	f := &fakeTraits{
		traits: map[string][]string{"root1": {"COMPUTE_NODE", "CUSTOM_RACK_7", GuestDriverTrait(525), "HW_CPU_X86_AVX2"}},
		gen:    map[string]int{"root1": 4},
	}
	srv := httptest.NewServer(f)
	defer srv.Close()
	sc := &gophercloud.ServiceClient{ProviderClient: &gophercloud.ProviderClient{HTTPClient: *srv.Client()}, Endpoint: srv.URL + "/"}
	ctx := context.Background()
	want := []string{GuestDriverTrait(535), GuestDriverTrait(550)}

	f.conflict = true
	if _, _, ok, err := setGuestDriverTraits(ctx, sc, "root1", want, map[string]bool{}); err != nil || ok || f.puts != 0 {
		t.Fatalf("on a 409: ok %v, err %v, %d writes; want nothing written, no error", ok, err, f.puts)
	}
	added, removed, ok, err := setGuestDriverTraits(ctx, sc, "root1", want, map[string]bool{})
	if err != nil || !ok {
		t.Fatalf("setGuestDriverTraits: ok %v, err %v", ok, err)
	}
	if !slices.Equal(added, want) || !slices.Equal(removed, []string{GuestDriverTrait(525)}) {
		t.Errorf("added %v, removed %v; want %v, [%s]", added, removed, want, GuestDriverTrait(525))
	}
	got := slices.Sorted(slices.Values(f.traits["root1"]))
	if w := []string{"COMPUTE_NODE", "CUSTOM_RACK_7", GuestDriverTrait(535), GuestDriverTrait(550), "HW_CPU_X86_AVX2"}; !slices.Equal(got, w) {
		t.Errorf("root traits %v, want %v", got, w)
	}
	if f.gen["root1"] != 5 {
		t.Errorf("generation %d, want 5 (one write)", f.gen["root1"])
	}
	// Done: a second round writes nothing.
	if _, _, ok, err := setGuestDriverTraits(ctx, sc, "root1", want, map[string]bool{}); err != nil || ok || f.puts != 1 {
		t.Errorf("second round: ok %v, err %v, %d writes; want 1 write in all", ok, err, f.puts)
	}
	// The vGPU manager reports no branch any more: the branch traits go,
	// the others stay.
	if _, removed, ok, err := setGuestDriverTraits(ctx, sc, "root1", nil, map[string]bool{}); err != nil || !ok || len(removed) != 2 {
		t.Errorf("no branch: ok %v, err %v, removed %v", ok, err, removed)
	}
	if got, w := slices.Sorted(slices.Values(f.traits["root1"])), []string{"COMPUTE_NODE", "CUSTOM_RACK_7", "HW_CPU_X86_AVX2"}; !slices.Equal(got, w) {
		t.Errorf("root traits %v, want %v", got, w)
	}
}
