package cli

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testagent"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestHostLayoutFromAgentReport: `vgpuctl host layout HOST` proposes the
// layout from the report a real agent on a fake host sent the bridge: its
// H200-like GPU (0000:c1:00.0, 8 VFs, 0000:c1:00.4 typed 1429 with no
// domain) holds at most 2 VFs of type 1429 (the type's max instances), the
// VF of that type first; 3 are refused with the reason, and type 1430
// is refused because the GPU holds VFs of 1429.
func TestHostLayoutFromAgentReport(t *testing.T) {
	e := startBridge(t)
	host := testsvc.Name("layout")
	testagent.Start(context.Background(), t, e.pool, testagent.Host{Name: host, Node: host + ".node",
		GPUs: [2]string{"0000:3b:00.0", "0000:d8:00.0"}, VM: "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01", Dir: t.TempDir()})

	r := e.reader.must(t, 0, "host", "layout", host, "--type", "1429", "-o", "json")
	var l struct {
		Host     string   `json:"host"`
		PF       string   `json:"pf"`
		VFs      []string `json:"vfs"`
		VFLayout string   `json:"vf_layout"`
		Alias    string   `json:"alias"`
		Provider string   `json:"provider"`
		Spec     []string `json:"device_spec"`
		Proposal struct {
			Holds        int    `json:"holds"`
			MaxInstances int    `json:"max_instances"`
			ProductID    string `json:"product_id"`
		} `json:"proposal"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	if l.Host != host || l.PF != "0000:c1:00.0" || !slices.Equal(l.VFs, []string{"0000:c1:00.4", "0000:c1:00.5"}) ||
		l.VFLayout != "0000:c1:00.0=1429:2" || l.Proposal.Holds != 2 || l.Proposal.MaxInstances != 2 || l.Proposal.ProductID != "2335" ||
		l.Alias != `{"device_type":"type-VF","name":"h200x-70c","product_id":"2335","vendor_id":"10de"}` ||
		l.Provider != host+".node_0000:C1:00.0" || len(l.Spec) != 1 || !strings.Contains(l.Spec[0], `"function":"[45]"`) {
		t.Errorf("proposal from the report: %+v", l)
	}

	r = e.reader.run(t, "host", "layout", host, "--type", "1429", "--count", "3")
	if r.code == 0 || !strings.Contains(r.stderr, "cannot hold 3 VFs of type 1429") || !strings.Contains(r.stderr, "max instances 2") {
		t.Errorf("--count 3: %s", r)
	}
	r = e.reader.run(t, "host", "layout", host, "--type", "1430")
	if r.code == 0 || !strings.Contains(r.stderr, "another type (0000:c1:00.4=1429)") {
		t.Errorf("type 1430 beside 1429: %s", r)
	}
	if r = e.reader.run(t, "host", "layout", "no-such-host", "--type", "1429"); r.code == 0 || !strings.Contains(r.stderr, "no agent report") {
		t.Errorf("unknown host: %s", r)
	}
	if r = e.anon.run(t, "host", "layout", host, "--type", "1429"); r.code == 0 {
		t.Errorf("without a token: %s", r)
	}
}
