// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// h200 is a vendor-VFIO H200 as an agent reports it: 8 VFs, of which
// typed are of typeID; the others free.
func h200(pf string, typed map[string]string, free ...string) protocol.GPU {
	g := protocol.GPU{PCI: pf, VendorVFIO: true, Health: protocol.HealthOK, DeviceID: "2335", VFDeviceID: "2335", FreeVFs: free,
		Types: []protocol.VGPUType{
			{ID: "1428", Name: "NVIDIA H200X-141C", FramebufferMiB: 143360, MaxInstances: 1},
			{ID: "1429", Name: "NVIDIA H200X-70C", FramebufferMiB: 71680, MaxInstances: 2},
			{ID: "1430", Name: "NVIDIA H200X-35C", FramebufferMiB: 35840, MaxInstances: 4},
		}}
	for vf, typ := range typed {
		g.Active = append(g.Active, protocol.VGPU{PCI: vf, TypeID: typ, Owner: protocol.OwnerNova})
	}
	return g
}

func vfs(bus string, fns ...string) []string {
	out := make([]string, len(fns))
	for i, f := range fns {
		out[i] = "0000:" + bus + ":" + f
	}
	return out
}

// TestProposeLayout: the GPU, the VFs and the count proposed from a
// report, and the counts and GPUs refused, with their reasons.
func TestProposeLayout(t *testing.T) {
	eight := vfs("c1", "00.4", "00.5", "00.6", "00.7", "01.0", "01.1", "01.2", "01.3")
	t4 := protocol.GPU{PCI: "0000:3b:00.0", Health: protocol.HealthOK, DeviceID: "1eb8",
		Types: []protocol.VGPUType{{ID: "nvidia-232", Name: "GRID T4-4Q", MaxInstances: 4}}}
	for _, tc := range []struct {
		name     string
		gpus     []protocol.GPU
		ask      layoutAsk
		wantPF   string
		wantVFs  []string
		layout   string
		others   int
		errParts []string // the refusal names these
	}{
		{name: "as many as the type allows", gpus: []protocol.GPU{t4, h200("0000:c1:00.0", nil, eight...)}, ask: layoutAsk{Type: "1430"},
			wantPF: "0000:c1:00.0", wantVFs: eight[:4], layout: "0000:c1:00.0=1430:4"},
		{name: "a count", gpus: []protocol.GPU{h200("0000:c1:00.0", nil, eight...)}, ask: layoutAsk{Type: "1430", Count: 2},
			wantPF: "0000:c1:00.0", wantVFs: eight[:2], layout: "0000:c1:00.0=1430:2"},
		{name: "free VFs in address order", gpus: []protocol.GPU{h200("0000:c1:00.0", nil, eight[5], eight[1], eight[3])}, ask: layoutAsk{Type: "1430"},
			wantPF: "0000:c1:00.0", wantVFs: []string{eight[1], eight[3], eight[5]}, layout: "0000:c1:00.0=1430:3"},
		{name: "type not offered", gpus: []protocol.GPU{h200("0000:c1:00.0", nil, eight...)}, ask: layoutAsk{Type: "1431"},
			errParts: []string{"does not offer type 1431", "1430 (NVIDIA H200X-35C)"}},
		{name: "VFs of the type kept first", gpus: []protocol.GPU{h200("0000:c1:00.0", map[string]string{eight[2]: "1430"}, eight[7], eight[0], eight[1])},
			ask: layoutAsk{Type: "1430"}, wantPF: "0000:c1:00.0", wantVFs: []string{eight[2], eight[0], eight[1], eight[7]}, layout: "0000:c1:00.0=1430:4"},
		{name: "count over max instances refused", gpus: []protocol.GPU{h200("0000:c1:00.0", nil, eight...)}, ask: layoutAsk{Type: "1429", Count: 3},
			errParts: []string{"cannot hold 3 VFs of type 1429", "max instances 2", "8 VFs free", "at most 2"}},
		{name: "count over free VFs refused", gpus: []protocol.GPU{h200("0000:c1:00.0", nil, eight[:3]...)}, ask: layoutAsk{Type: "1430", Count: 4},
			errParts: []string{"cannot hold 4 VFs", "max instances 4, 3 VFs free", "at most 3"}},
		{name: "fewer than typed refused", gpus: []protocol.GPU{h200("0000:c1:00.0", map[string]string{eight[0]: "1430", eight[1]: "1430"}, eight[2:]...)},
			ask: layoutAsk{Type: "1430", Count: 1}, errParts: []string{"2 VFs of type 1430 already", "never clears"}},
		{name: "another type on the GPU refused", gpus: []protocol.GPU{h200("0000:c1:00.0", map[string]string{eight[0]: "1429"}, eight[1:]...)},
			ask: layoutAsk{Type: "1430"}, errParts: []string{"no GPU of host h1 can hold type 1430", "another type (0000:c1:00.4=1429)"}},
		{name: "no VFs enabled", gpus: []protocol.GPU{h200("0000:c1:00.0", nil)}, ask: layoutAsk{Type: "1430"},
			errParts: []string{"sriov_numvfs is 0"}},
		{name: "mdev GPU named", gpus: []protocol.GPU{t4}, ask: layoutAsk{PF: "0000:3b:00.0", Type: "1430"},
			errParts: []string{"not a vendor-VFIO"}},
		{name: "unknown PF", gpus: []protocol.GPU{t4}, ask: layoutAsk{PF: "0000:c2:00.0", Type: "1430"},
			errParts: []string{"reports no GPU 0000:c2:00.0"}},
		{name: "the GPU that holds the most of several", gpus: []protocol.GPU{
			h200("0000:c1:00.0", nil, eight[:2]...),
			h200("0000:e1:00.0", nil, vfs("e1", "00.4", "00.5", "00.6", "00.7", "01.0")...),
			h200("0000:d1:00.0", nil, vfs("d1", "00.4", "00.5", "00.6", "00.7")...)},
			ask: layoutAsk{Type: "1430"}, wantPF: "0000:d1:00.0", wantVFs: vfs("d1", "00.4", "00.5", "00.6", "00.7"), layout: "0000:d1:00.0=1430:4", others: 2},
		{name: "--pf among several", gpus: []protocol.GPU{h200("0000:c1:00.0", nil, eight...), h200("0000:D1:00.0", nil, vfs("d1", "00.4", "00.5")...)},
			ask: layoutAsk{PF: "0000:d1:00.0", Type: "1429"}, wantPF: "0000:d1:00.0", wantVFs: vfs("d1", "00.4", "00.5"), layout: "0000:d1:00.0=1429:2"},
		{name: "a failed GPU passed over", gpus: []protocol.GPU{
			func() protocol.GPU {
				g := h200("0000:c1:00.0", nil, eight...)
				g.Health, g.Fault = protocol.HealthFailed, &protocol.GPUFault{Source: "xid", Xid: 79, Reason: "Xid 79"}
				return g
			}(),
			h200("0000:d1:00.0", nil, vfs("d1", "00.4")...)},
			ask: layoutAsk{Type: "1430"}, wantPF: "0000:d1:00.0", wantVFs: vfs("d1", "00.4"), layout: "0000:d1:00.0=1430:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := proposeLayout(protocol.Report{Host: "h1", GPUs: tc.gpus}, tc.ask)
			if len(tc.errParts) > 0 {
				if err == nil {
					t.Fatalf("proposed %+v, want a refusal", p)
				}
				for _, s := range tc.errParts {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("refusal %q lacks %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.PF != tc.wantPF || !slices.Equal(p.VFs, tc.wantVFs) || p.VFLayout != tc.layout || p.Count != len(tc.wantVFs) ||
				len(p.Others) != tc.others || p.ProductID != "2335" {
				t.Errorf("proposed %+v, want %s %v %s (%d others)", p, tc.wantPF, tc.wantVFs, tc.layout, tc.others)
			}
		})
	}
}

func TestAliasName(t *testing.T) {
	for in, want := range map[string]string{"NVIDIA H200X-35C": "h200x-35c", "GRID A100 4C": "a100-4c", "": "vgpu-vf-1430", "H200/x": "vgpu-vf-1430"} {
		if got := aliasName(in, "1430"); got != want {
			t.Errorf("aliasName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestHostLayoutFromReport: with HOST, vgpuctl reads the report from
// GET /v1/hosts/{name}/report and prints the proposal's lines; a report
// without the VFs' device id asks for --product; a count the GPU cannot
// hold fails.
func TestHostLayoutFromReport(t *testing.T) {
	gpu := h200("0000:c1:00.0", nil, vfs("c1", "00.4", "00.5", "00.6", "00.7", "01.0")...)
	report := func(g protocol.GPU) []byte {
		b, _ := json.Marshal(map[string]any{"name": "compute-7", "node": "compute-7.example",
			"report": protocol.Report{V: 1, Host: "compute-7", Node: "compute-7.example", GPUs: []protocol.GPU{g}}})
		return b
	}
	body := report(gpu)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/hosts/compute-7/report" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body) //nolint:errcheck
	}))
	defer srv.Close()
	base := []string{"--url", srv.URL, "--token", "t", "host", "layout", "compute-7", "--type", "1430"}
	code, out, errs := vgpuctl(append(base, "-o", "json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var l hostLayout
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if l.VFLayout != "0000:c1:00.0=1430:4" || l.Proposal == nil || l.Proposal.Holds != 4 || len(l.VFs) != 4 ||
		l.Alias != `{"device_type":"type-VF","name":"h200x-35c","product_id":"2335","vendor_id":"10de"}` ||
		l.Provider != "compute-7.example_0000:C1:00.0" || len(l.DeviceSpec) != 1 || l.Host != "compute-7" {
		t.Errorf("layout %+v", l)
	}
	code, out, _ = vgpuctl(append(base, "--count", "2", "--alias", "big")...)
	for _, want := range []string{"vf_layout", "0000:c1:00.0=1430:2", `"function":"[45]"`, "big=CUSTOM_VGPU_VF_1430", "proposal"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("table (exit %d) lacks %q:\n%s", code, want, out)
		}
	}
	if code, _, errs := vgpuctl(append(base, "--count", "5")...); code == 0 || !strings.Contains(errs, "max instances 4") {
		t.Errorf("--count 5: exit %d, %s", code, errs)
	}
	if code, _, errs := vgpuctl(append(base, "--vf", "0000:c1:00.4")...); code != 2 || !strings.Contains(errs, "--vf with HOST") {
		t.Errorf("--vf with HOST: exit %d, %s", code, errs)
	}
	gpu.VFDeviceID = ""
	body = report(gpu)
	if code, _, errs := vgpuctl(base...); code != 2 || !strings.Contains(errs, "give --product") || !strings.Contains(errs, "0000:c1:00.0=1430:4") {
		t.Errorf("no device id reported: exit %d, %s", code, errs)
	}
	if code, out, errs := vgpuctl(append(base, "--product", "233b")...); code != 0 || !strings.Contains(out, `"product_id":"233b"`) {
		t.Errorf("--product: exit %d, %s %s", code, out, errs)
	}
}
