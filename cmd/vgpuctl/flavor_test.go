package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// fakeNova is the compute API's flavor calls, in memory.
type fakeNova struct {
	mu        sync.Mutex
	flavors   map[string]map[string]any // id → flavor as Nova shows it
	order     []string
	failSpecs bool     // POST os-extra_specs answers 400
	calls     []string // "POST /flavors", …
	next      int
}

func (n *fakeNova) add(id, name string, vcpus, ram, disk int, specs map[string]string) {
	if n.flavors == nil {
		n.flavors = map[string]map[string]any{}
	}
	if specs == nil {
		specs = map[string]string{}
	}
	n.flavors[id] = map[string]any{"id": id, "name": name, "vcpus": vcpus, "ram": ram, "disk": disk, "swap": "",
		"OS-FLV-EXT-DATA:ephemeral": 0, "os-flavor-access:is_public": true, "extra_specs": specs}
	n.order = append(n.order, id)
}

func (n *fakeNova) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := strings.TrimPrefix(r.URL.Path, "/v2.1")
	n.calls = append(n.calls, r.Method+" "+p)
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("X-Auth-Token") != "admin:admin" {
		http.Error(w, `{"unauthorized": {"message": "no token"}}`, http.StatusUnauthorized)
		return
	}
	if v := r.Header.Get("X-OpenStack-Nova-API-Version"); v != "2.61" {
		http.Error(w, "microversion "+v, http.StatusBadRequest)
		return
	}
	parts := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case r.Method == http.MethodGet && p == "/flavors/detail":
		if r.URL.Query().Get("is_public") != "None" {
			http.Error(w, "want is_public=None", http.StatusBadRequest)
			return
		}
		out := []map[string]any{}
		for _, id := range n.order {
			if f, ok := n.flavors[id]; ok {
				out = append(out, f)
			}
		}
		json.NewEncoder(w).Encode(map[string]any{"flavors": out})
	case r.Method == http.MethodPost && p == "/flavors":
		var body struct {
			Flavor struct {
				Name        string `json:"name"`
				VCPUs       int    `json:"vcpus"`
				RAM         int    `json:"ram"`
				Disk        int    `json:"disk"`
				Public      *bool  `json:"os-flavor-access:is_public"`
				Description string `json:"description"`
			} `json:"flavor"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		for _, f := range n.flavors {
			if f["name"] == body.Flavor.Name {
				w.WriteHeader(http.StatusConflict)
				w.Write([]byte(`{"conflictingRequest": {"code": 409, "message": "Flavor with name ` + body.Flavor.Name + ` already exists."}}`))
				return
			}
		}
		n.next++
		id := "new-" + string(rune('0'+n.next))
		n.add(id, body.Flavor.Name, body.Flavor.VCPUs, body.Flavor.RAM, body.Flavor.Disk, nil)
		json.NewEncoder(w).Encode(map[string]any{"flavor": n.flavors[id]})
	case r.Method == http.MethodPost && len(parts) == 3 && parts[2] == "os-extra_specs":
		f, ok := n.flavors[parts[1]]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if n.failSpecs {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"badRequest": {"code": 400, "message": "Validation failed: extra spec trait:X"}}`))
			return
		}
		var body struct {
			ExtraSpecs map[string]string `json:"extra_specs"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		specs := f["extra_specs"].(map[string]string)
		for k, v := range body.ExtraSpecs {
			specs[k] = v
		}
		json.NewEncoder(w).Encode(map[string]any{"extra_specs": specs})
	case r.Method == http.MethodDelete && len(parts) == 2 && parts[0] == "flavors":
		if _, ok := n.flavors[parts[1]]; !ok {
			http.NotFound(w, r)
			return
		}
		delete(n.flavors, parts[1])
		w.WriteHeader(http.StatusAccepted)
	default:
		http.NotFound(w, r)
	}
}

func (n *fakeNova) names() map[string]map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]map[string]string{}
	for _, f := range n.flavors {
		out[f["name"].(string)] = f["extra_specs"].(map[string]string)
	}
	return out
}

// profilesBridge answers GET /v1/profiles: T4-4Q with two GPUs typed for
// it, T4-2Q with none, T4-8Q without a type id.
func profilesBridge(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/profiles" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"profiles": []map[string]any{
			{"name": "T4-2Q", "type_id": "nvidia-231", "trait": "CUSTOM_NVIDIA_231", "gpus": 0},
			{"name": "T4-4Q", "type_id": "nvidia-232", "trait": "CUSTOM_NVIDIA_232", "gpus": 2},
			{"name": "T4-8Q", "gpus": 0},
		}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

type planJSON struct {
	Proposals []nova.FlavorProposal `json:"proposals"`
	Skipped   []nova.PlanSkip       `json:"skipped"`
}

func TestFlavorPlanCommand(t *testing.T) {
	t.Setenv("OS_CLOUD", "")
	t.Setenv("VGPUCTL_COMPUTE_TOKEN", "")
	br := profilesBridge(t)
	fn := &fakeNova{}
	fn.add("1", "m1.small", 2, 2048, 20, nil)
	fn.add("2", "m1.large", 4, 8192, 40, map[string]string{"hw:cpu_policy": "dedicated"})
	fn.add("3", "gpu.large", 4, 8192, 40, map[string]string{"hw:cpu_policy": "dedicated", "resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required",
		"trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT": "forbidden"})
	fn.add("4", "bad", 1, 1, 1, map[string]string{"resources:VGPU": "x"})
	nv := httptest.NewServer(fn)
	defer nv.Close()
	base := []string{"flavor", "plan", "--url", br.URL, "--token", "t", "--compute-url", nv.URL + "/v2.1", "--compute-token", "admin:admin"}

	code, out, errs := vgpuctl(base...)
	if code != exitOK {
		t.Fatalf("plan: exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"FLAVOR               BASED ON  PROFILE  ACTION   DETAIL",
		"m1.large.vgpu-t4-4q  m1.large  T4-4Q    covered  equal to gpu.large (id 3)",
		"m1.small.vgpu-t4-4q  m1.small  T4-4Q    create   vcpus=2 ram=2048 disk=20 + resources1:VGPU=1 trait1:CUSTOM_NVIDIA_232=required trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "T4-2Q") || strings.Contains(out, "gpu.large.vgpu") {
		t.Errorf("a profile without GPUs, or a vGPU flavor as base:\n%s", out)
	}
	if !strings.Contains(errs, `flavor bad left out: extra spec "resources:VGPU"="x"`) {
		t.Errorf("stderr lacks the malformed flavor: %s", errs)
	}

	// --apply creates, with the extra specs.
	code, out, errs = vgpuctl(append(base, "--apply")...)
	if code != exitOK || !strings.Contains(out, "m1.small.vgpu-t4-4q  m1.small  T4-4Q    created  id new-1") {
		t.Fatalf("apply: exit %d:\n%s\n%s", code, out, errs)
	}
	if got := fn.names()["m1.small.vgpu-t4-4q"]; got["resources1:VGPU"] != "1" || got["trait1:CUSTOM_NVIDIA_232"] != "required" ||
		got["trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT"] != "forbidden" || len(got) != 3 {
		t.Errorf("created flavor's extra specs %v", got)
	}
	// Again: exists, as JSON; and --profile plans a profile no GPU has.
	code, out, errs = vgpuctl(append(base, "-o", "json", "--apply", "--profile", "t4-4q,T4-2Q", "--flavor", "m1.s*")...)
	if code != exitOK {
		t.Fatalf("again: exit %d: %s", code, errs)
	}
	var pj planJSON
	if err := json.Unmarshal([]byte(out), &pj); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(pj.Proposals) != 2 || pj.Proposals[0].Profile != "T4-2Q" || pj.Proposals[0].Action != nova.PlanCreated ||
		pj.Proposals[1].Action != nova.PlanExists || pj.Proposals[1].ExistingID != "new-1" {
		t.Errorf("second apply: %+v", pj.Proposals)
	}

	// Extra specs refused: the flavor is deleted again, exit 1.
	fn.add("5", "m1.tiny", 1, 512, 1, nil)
	fn.failSpecs = true
	code, out, errs = vgpuctl(append(base, "--apply", "--flavor", "m1.tiny")...)
	if code != exitFailure || !strings.Contains(out, "failed") || !strings.Contains(out, "Validation failed") ||
		!strings.Contains(out, "flavor deleted again") || !strings.Contains(errs, "1 flavor(s) could not be created") {
		t.Errorf("failed extra specs: exit %d:\n%s\n%s", code, out, errs)
	}
	if _, ok := fn.names()["m1.tiny.vgpu-t4-4q"]; ok {
		t.Error("the half-made flavor was left in Nova")
	}
	fn.mu.Lock()
	calls := strings.Join(fn.calls[len(fn.calls)-3:], ", ")
	fn.mu.Unlock()
	if !strings.HasPrefix(calls, "POST /flavors, POST /flavors/new-") || !strings.Contains(calls, "DELETE /flavors/new-") {
		t.Errorf("last calls %s, want create, extra specs, delete", calls)
	}

	// Nova refuses the token: exit 1 with Nova's message.
	code, _, errs = vgpuctl("flavor", "plan", "--url", br.URL, "--token", "t", "--compute-url", nv.URL+"/v2.1", "--compute-token", "bad")
	if code != exitFailure || !strings.Contains(errs, "nova: list flavors: 401 no token") {
		t.Errorf("bad Nova token: exit %d: %s", code, errs)
	}
}

func TestFlavorPlanExitCodes(t *testing.T) {
	t.Setenv("OS_CLOUD", "")
	t.Setenv("VGPUCTL_COMPUTE_TOKEN", "")
	br := profilesBridge(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"no way to Nova", []string{"--url", br.URL}, exitUsage, "how to reach Nova"},
		{"token without URL", []string{"--url", br.URL, "--compute-token", "x"}, exitUsage, "--compute-token needs --compute-url"},
		{"URL without token", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1"}, exitUsage, "--compute-url needs --compute-token"},
		{"bad pattern", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--flavor", "["}, exitUsage, "--flavor"},
		{"driver branch with r", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--driver-branch", "r550"}, exitUsage,
			`--driver-branch "r550": want a guest driver release branch, a number of 1 to 9999 such as 550`},
		{"driver version as branch", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--driver-branch", "550.54.15"}, exitUsage,
			`--driver-branch "550.54.15": want`},
		{"driver branch of 5 digits", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--driver-branch", "10000"}, exitUsage,
			`--driver-branch "10000": want`},
		{"driver branch 0", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--driver-branch", "0"}, exitUsage,
			`--driver-branch "0": want`},
		{"negative driver branch", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--driver-branch=-550"}, exitUsage,
			`--driver-branch "-550": want`},
		{"driver branch before Nova", []string{"--url", "http://127.0.0.1:1", "--driver-branch", "55x"}, exitUsage, `--driver-branch "55x"`},
		{"unknown profile", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--profile", "T4-5Q"}, exitUsage,
			"--profile T4-5Q: not in the bridge's profile catalog"},
		{"profile without trait", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x", "--profile", "T4-8Q"}, exitFailure,
			"profile T4-8Q: its type id is not known yet"},
		{"Nova unreachable", []string{"--url", br.URL, "--compute-url", "http://127.0.0.1:1", "--compute-token", "x"}, exitNoAPI, "nova: list flavors at http://127.0.0.1:1/"},
		{"bridge unreachable", []string{"--url", "http://127.0.0.1:1", "--compute-url", "http://127.0.0.1:1", "--compute-token", "x"}, exitNoAPI, "cannot reach http://127.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := vgpuctl(append([]string{"flavor", "plan"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errs, tc.err) {
				t.Errorf("exit %d, want %d; stderr %s (want %q)", code, tc.code, errs, tc.err)
			}
		})
	}
}

// TestFlavorPlanCoveredByCreated: of two equal bases, --apply creates the
// first's vGPU flavor only; the second's row names it with its new id.
func TestFlavorPlanCoveredByCreated(t *testing.T) {
	t.Setenv("OS_CLOUD", "")
	t.Setenv("VGPUCTL_COMPUTE_TOKEN", "admin:admin")
	br := profilesBridge(t)
	fn := &fakeNova{}
	fn.add("1", "a.small", 2, 2048, 20, nil)
	fn.add("2", "b.small", 2, 2048, 20, nil)
	nv := httptest.NewServer(fn)
	defer nv.Close()
	code, out, errs := vgpuctl("flavor", "plan", "--apply", "--url", br.URL, "--token", "t", "--compute-url", nv.URL+"/v2.1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"a.small.vgpu-t4-4q  a.small   T4-4Q    created  id new-1",
		"b.small.vgpu-t4-4q  b.small   T4-4Q    covered  equal to a.small.vgpu-t4-4q (id new-1), created now",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := len(fn.names()); n != 3 {
		t.Errorf("%d flavors in Nova, want the two bases and one vGPU flavor", n)
	}
}

// TestFlavorPlanBridgeOwned: a profile whose only GPUs are bridge-owned is
// not planned (Nova's resources:VGPU flavors never reach those GPUs), and
// the plan says so, naming the bridge's resource class.
func TestFlavorPlanBridgeOwned(t *testing.T) {
	t.Setenv("OS_CLOUD", "")
	t.Setenv("VGPUCTL_COMPUTE_TOKEN", "")
	if apiclient.BridgeOwnedClass != placement.BridgeClass {
		t.Fatalf("apiclient.BridgeOwnedClass %s, placement.BridgeClass %s", apiclient.BridgeOwnedClass, placement.BridgeClass)
	}
	br := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"profiles": []map[string]any{
			{"name": "T4-4Q", "type_id": "nvidia-232", "trait": "CUSTOM_NVIDIA_232", "gpus": 3, "bridge_owned_gpus": 1},
			{"name": "H200X-70C", "type_id": "1429", "trait": "CUSTOM_1429", "gpus": 1, "bridge_owned_gpus": 1},
			{"name": "H200X-35C", "type_id": "1430", "trait": "CUSTOM_1430", "gpus": 2, "nova_vf_gpus": 2},
		}})
	}))
	defer br.Close()
	fn := &fakeNova{}
	fn.add("1", "m1.small", 2, 2048, 20, nil)
	nv := httptest.NewServer(fn)
	defer nv.Close()
	code, out, errs := vgpuctl("flavor", "plan", "--url", br.URL, "--token", "t", "--compute-url", nv.URL+"/v2.1", "--compute-token", "admin:admin")
	if code != exitOK {
		t.Fatalf("plan: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "m1.small.vgpu-t4-4q") {
		t.Errorf("T4-4Q (two Nova GPUs) not planned:\n%s", out)
	}
	if strings.Contains(out, "H200X-70C") {
		t.Errorf("a profile of bridge-owned GPUs only is planned:\n%s", out)
	}
	if strings.Contains(out, "H200X-35C") {
		t.Errorf("a resources:VGPU flavor is planned for a profile of Nova-owned VFs only:\n%s", out)
	}
	for _, want := range []string{
		"profile H200X-35C: 2 of its 2 GPUs are Nova-owned VFs: a flavor reaches them with pci_passthrough:alias",
		"profile H200X-70C: 1 of its 1 GPUs are bridge-owned (resource class CUSTOM_VGPU_BRIDGE)",
		"profile T4-4Q: 1 of its 3 GPUs are bridge-owned",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
}

// TestFlavorPlanNovaVFAlias: with --alias H200X-35C=h200x-35c, a profile
// whose GPUs are Nova-owned VFs gets alias flavors (its base's contents
// plus pci_passthrough:alias=h200x-35c:1, no resources:VGPU, no trait),
// which --apply creates; a base that asks for PCI devices already is left
// out; a profile of Nova's mdev GPUs keeps its resources:VGPU flavor; a
// bad --alias is a usage error.
func TestFlavorPlanNovaVFAlias(t *testing.T) {
	t.Setenv("OS_CLOUD", "")
	t.Setenv("VGPUCTL_COMPUTE_TOKEN", "")
	br := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"profiles": []map[string]any{
			{"name": "T4-4Q", "type_id": "nvidia-232", "trait": "CUSTOM_NVIDIA_232", "gpus": 2},
			{"name": "H200X-35C", "type_id": "1430", "trait": "CUSTOM_1430", "gpus": 2, "nova_vf_gpus": 2},
		}})
	}))
	defer br.Close()
	fn := &fakeNova{}
	fn.add("1", "m1.small", 2, 2048, 20, nil)
	fn.add("2", "nic.small", 2, 2048, 20, map[string]string{"pci_passthrough:alias": "nic:1"})
	nv := httptest.NewServer(fn)
	defer nv.Close()
	base := []string{"flavor", "plan", "--url", br.URL, "--token", "t", "--compute-url", nv.URL + "/v2.1", "--compute-token", "admin:admin",
		"--alias", "h200x-35c=h200x-35c"}

	code, out, errs := vgpuctl(append(base, "-o", "json")...)
	if code != exitOK {
		t.Fatalf("plan: exit %d: %s", code, errs)
	}
	var pj planJSON
	if err := json.Unmarshal([]byte(out), &pj); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	byName := map[string]nova.FlavorProposal{}
	for _, p := range pj.Proposals {
		byName[p.Flavor.Name] = p
	}
	vf := byName["m1.small.vgpu-h200x-35c"]
	if vf.Action != nova.PlanCreate || vf.Profile != "H200X-35C" || len(vf.Flavor.ExtraSpecs) != 1 ||
		vf.Flavor.ExtraSpecs["pci_passthrough:alias"] != "h200x-35c:1" || !strings.Contains(vf.Detail, "pci_passthrough:alias=h200x-35c:1") {
		t.Errorf("alias flavor: %+v", vf)
	}
	if t4 := byName["m1.small.vgpu-t4-4q"]; t4.Flavor.ExtraSpecs["resources1:VGPU"] != "1" {
		t.Errorf("T4-4Q flavor: %+v", t4)
	}
	if _, ok := byName["nic.small.vgpu-h200x-35c"]; ok {
		t.Errorf("an alias flavor planned on a base with PCI devices: %+v", pj.Proposals)
	}
	left := false
	for _, s := range pj.Skipped {
		left = left || s.Flavor == "nic.small" && s.Profile == "H200X-35C" && strings.Contains(s.Reason, "pci_passthrough:alias")
	}
	if !left {
		t.Errorf("skipped %+v lacks nic.small for H200X-35C", pj.Skipped)
	}

	code, out, errs = vgpuctl(append(base, "--apply", "--flavor", "m1.*")...)
	if code != exitOK || !strings.Contains(out, "m1.small.vgpu-h200x-35c") || !strings.Contains(out, "created") {
		t.Fatalf("apply: exit %d:\n%s\n%s", code, out, errs)
	}
	if got := fn.names()["m1.small.vgpu-h200x-35c"]; got["pci_passthrough:alias"] != "h200x-35c:1" || len(got) != 1 {
		t.Errorf("created alias flavor's extra specs %v", got)
	}

	if code, _, _ := vgpuctl(append(base[:len(base)-1], "H200X-35C=a:b")...); code != exitUsage {
		t.Errorf("--alias with ':' : exit %d, want usage", code)
	}
}

// TestFlavorPlanDriverBranch: with --driver-branch 550 each proposal is
// BASE.vgpu-PROFILE-r550 and asks for
// trait1:CUSTOM_VGPU_GUEST_DRIVER_R550=required besides the VGPU's specs
// (driver_branch 550 in JSON); the trait counts in the comparison: a
// flavor without it neither covers the proposal nor is it under its name
// (conflict), one with it covers it; --apply creates the flavor with the
// trait, and the plan without a branch is unchanged.
func TestFlavorPlanDriverBranch(t *testing.T) {
	t.Setenv("OS_CLOUD", "")
	t.Setenv("VGPUCTL_COMPUTE_TOKEN", "admin:admin")
	br := profilesBridge(t)
	vgpu := func(more ...string) map[string]string {
		m := map[string]string{"resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required", "trait1:" + nova.GPUFaultTrait: "forbidden"}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	r550 := "trait1:" + placement.GuestDriverTrait(550)
	fn := &fakeNova{}
	fn.add("1", "m1.small", 2, 2048, 20, nil)
	fn.add("2", "m1.large", 4, 8192, 40, nil)
	fn.add("3", "m1.tiny", 1, 512, 1, nil)
	fn.add("4", "g1.small", 2, 2048, 20, vgpu())                                                     // m1.small's flavor without a branch
	fn.add("5", "m1.large.vgpu-t4-4q-r550", 4, 8192, 40, vgpu())                                     // the name, without the trait
	fn.add("6", "g1.tiny.r550", 1, 512, 1, vgpu(r550, "required"))                                   // m1.tiny's flavor with the trait
	fn.add("7", "g1.tiny.r535", 1, 512, 1, vgpu("trait1:CUSTOM_VGPU_GUEST_DRIVER_R535", "required")) // another branch
	nv := httptest.NewServer(fn)
	defer nv.Close()
	base := []string{"flavor", "plan", "--url", br.URL, "--token", "t", "--compute-url", nv.URL + "/v2.1", "--flavor", "m1.*"}

	code, out, errs := vgpuctl(append(base, "--driver-branch", "550")...)
	if code != exitOK {
		t.Fatalf("plan: exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"m1.large.vgpu-t4-4q-r550  m1.large  T4-4Q    conflict  left alone: extra spec " + r550 + " missing",
		// DETAIL is clipped in the table; the JSON below has all of it.
		"m1.small.vgpu-t4-4q-r550  m1.small  T4-4Q    create    vcpus=2 ram=2048 disk=20 + resources1:VGPU=1 trait1:CUSTOM_NVIDIA_232=required " +
			"trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden trait1:CUSTOM_VGPU_GUEST",
		"m1.tiny.vgpu-t4-4q-r550   m1.tiny   T4-4Q    covered   equal to g1.tiny.r550 (id 6)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 4 {
		t.Errorf("%d lines, want a header and 3 rows:\n%s", n, out)
	}

	// Without a branch: the flavors of before, which the trait's flavors
	// do not cover (the flavor named -r550 without the trait does: it is
	// a flavor without a branch).
	code, out, errs = vgpuctl(base...)
	for _, want := range []string{
		"m1.large.vgpu-t4-4q  m1.large  T4-4Q    covered  equal to m1.large.vgpu-t4-4q-r550 (id 5)",
		"m1.small.vgpu-t4-4q  m1.small  T4-4Q    covered  equal to g1.small (id 4)",
		"m1.tiny.vgpu-t4-4q   m1.tiny   T4-4Q    create",
	} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("plan without a branch: exit %d, lacks %q:\n%s%s", code, want, out, errs)
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(l, "R550") || strings.HasSuffix(strings.Fields(l)[0], "-r550") {
			t.Errorf("the plan without a branch plans the branch: %q", l)
		}
	}

	// Apply: the flavor with the trait, then (as JSON) it exists.
	code, out, errs = vgpuctl(append(base, "--driver-branch", "550", "--apply")...)
	if code != exitOK || !strings.Contains(out, "m1.small.vgpu-t4-4q-r550  m1.small  T4-4Q    created   id new-1") {
		t.Fatalf("apply: exit %d:\n%s\n%s", code, out, errs)
	}
	if got, want := fn.names()["m1.small.vgpu-t4-4q-r550"], vgpu(r550, "required"); !maps.Equal(got, want) {
		t.Errorf("created flavor's extra specs %v, want %v", got, want)
	}
	code, out, errs = vgpuctl(append(base, "--driver-branch", "550", "--flavor", "m1.small", "-o", "json")...)
	if code != exitOK {
		t.Fatalf("again: exit %d: %s", code, errs)
	}
	var pj planJSON
	if err := json.Unmarshal([]byte(out), &pj); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(pj.Proposals) != 3 {
		t.Fatalf("proposals %+v, want one per m1 flavor", pj.Proposals)
	}
	p := pj.Proposals[1]
	if p.Flavor.Name != "m1.small.vgpu-t4-4q-r550" || p.Action != nova.PlanExists || p.ExistingID != "new-1" || p.DriverBranch != 550 ||
		p.Flavor.ExtraSpecs[r550] != "required" || !strings.Contains(out, `"driver_branch": 550`) {
		t.Errorf("second run: %+v\n%s", p, out)
	}
	if d := pj.Proposals[0].Detail; d != "left alone: extra spec "+r550+" missing" {
		t.Errorf("conflict detail %q", d)
	}
	for _, p := range pj.Proposals {
		if p.DriverBranch != 550 || !strings.HasSuffix(p.Flavor.Name, ".vgpu-t4-4q-r550") {
			t.Errorf("proposal %s: driver_branch %d, want 550", p.Flavor.Name, p.DriverBranch)
		}
	}
}
