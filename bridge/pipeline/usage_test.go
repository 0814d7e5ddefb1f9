package pipeline

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

type fakeCatalog map[string]catalog.Profile // by trait

func (c fakeCatalog) ByName(string) (catalog.Profile, bool) { return catalog.Profile{}, false }
func (c fakeCatalog) ByTypeID(id string) (catalog.Profile, bool) {
	for _, p := range c {
		if p.TypeID == id {
			return p, true
		}
	}
	return catalog.Profile{}, false
}
func (c fakeCatalog) ByTrait(tr string) (catalog.Profile, bool) {
	p, ok := c[tr]
	return p, ok
}

// sampleRow is an inbox row of Nova's own sample, its flavor given
// extraSpecs (none: the sample's own).
func sampleRow(t *testing.T, name string, extraSpecs map[string]string) InboxRow {
	t.Helper()
	b, err := novatest.ResolveFile(filepath.Join("..", "..", novatest.SamplesDir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var msg struct {
		EventType string         `json:"event_type"`
		Payload   map[string]any `json:"payload"`
	}
	if err := json.Unmarshal(b, &msg); err != nil {
		t.Fatal(err)
	}
	if extraSpecs != nil {
		data := msg.Payload["nova_object.data"].(map[string]any)
		data["flavor"].(map[string]any)["nova_object.data"].(map[string]any)["extra_specs"] = extraSpecs
	}
	p, _ := json.Marshal(msg.Payload)
	return InboxRow{ID: 1, Source: "nova", EventType: msg.EventType, InstanceUUID: "178b0921-8f85-4257-88b6-2e743b5a975c", Payload: p}
}

// What a flavor gives an instance is read from each of Nova's own
// notification samples: the vGPU groups of a flavor on a host, in a state
// that holds resources; nothing once it is shelved offloaded or deleted,
// or for a flavor without vGPUs. A flavor's pci_passthrough:alias naming
// an alias of Nova-owned VF GPUs gives that many VFs of its class and
// type; other aliases give nothing.
func TestFlavorHolding(t *testing.T) {
	cat := fakeCatalog{"CUSTOM_NVIDIA_232": {Name: "T4-4Q", TypeID: "nvidia-232"}, "CUSTOM_1430": {Name: "H200X-35C", TypeID: "1430"}}
	aliases := map[string]placement.NovaVFAlias{"h200x-35c": {Class: "CUSTOM_VGPU_VF_1430", TypeID: "1430"},
		"odd-type": {Class: "CUSTOM_VGPU_VF_9", TypeID: "9"}}
	vf := map[string]string{"pci_passthrough:alias": "h200x-35c:2"}
	vfAndNIC := map[string]string{"pci_passthrough:alias": "nic:1, h200x-35c : 1,odd-type:1"}
	notVF := map[string]string{"pci_passthrough:alias": "nic:1,h200x-35c:x,h200x-35c"}
	vfWant := requests.FlavorVGPU{Profile: "H200X-35C", VGPUType: "1430", ResourceClass: "CUSTOM_VGPU_VF_1430", Amount: 2}
	typed := map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"}
	untyped := map[string]string{"resources1:VGPU": "2", "resources:VCPU": "1"}
	for _, tc := range []struct {
		sample string
		specs  map[string]string
		want   []requests.FlavorVGPU
	}{
		{"instance-create-end", typed, []requests.FlavorVGPU{{Profile: "T4-4Q", VGPUType: "nvidia-232", ResourceClass: "VGPU", Amount: 1}}},
		{"instance-create-end", untyped, []requests.FlavorVGPU{{ResourceClass: "VGPU", Amount: 2}}},
		{"instance-create-end", nil, nil},
		{"instance-resize_finish-end", typed, []requests.FlavorVGPU{{Profile: "T4-4Q", VGPUType: "nvidia-232", ResourceClass: "VGPU", Amount: 1}}},
		{"instance-shelve_offload-end", typed, nil},
		{"instance-delete-end", typed, nil},
		{"instance-create-start", typed, nil}, // building: not launched yet
		{"instance-create-end", vf, []requests.FlavorVGPU{vfWant}},
		{"instance-create-end", vfAndNIC, []requests.FlavorVGPU{{Profile: "H200X-35C", VGPUType: "1430", ResourceClass: "CUSTOM_VGPU_VF_1430", Amount: 1},
			{VGPUType: "9", ResourceClass: "CUSTOM_VGPU_VF_9", Amount: 1}}},
		{"instance-create-end", notVF, nil},
		{"instance-shelve_offload-end", vf, nil},
		{"instance-delete-end", vf, nil},
	} {
		t.Run(tc.sample, func(t *testing.T) {
			h, ok := flavorHolding(cat, aliases, sampleRow(t, tc.sample, tc.specs))
			if !ok {
				t.Fatal("not read as an instance event")
			}
			if h.Project == "" || h.Instance == "" {
				t.Errorf("holding without its instance or project: %+v", h)
			}
			if len(h.VGPUs) != len(tc.want) {
				t.Fatalf("vGPUs = %+v, want %+v", h.VGPUs, tc.want)
			}
			for i := range tc.want {
				if h.VGPUs[i] != tc.want[i] {
					t.Errorf("vGPU %d = %+v, want %+v", i, h.VGPUs[i], tc.want[i])
				}
			}
		})
	}
	if _, ok := flavorHolding(cat, aliases, InboxRow{Source: "webhook:batch", InstanceUUID: "x", Payload: []byte(`{}`)}); ok {
		t.Error("a webhook row was read as a Nova instance event")
	}
	if _, ok := flavorHolding(cat, aliases, sampleRow(t, "flavor-create", nil)); ok {
		t.Error("a flavor notification was read as an instance event")
	}
}

// A Nova event's time is Nova's timestamp within [receipt - tolerance,
// receipt], however far off the sender's clock is.
func TestNovaTime(t *testing.T) {
	recv := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	const tol = 5 * time.Minute
	for _, c := range []struct {
		name     string
		occurred time.Time
		want     time.Time
	}{
		{"on time", recv.Add(-time.Second), recv.Add(-time.Second)},
		{"5s ahead", recv.Add(5 * time.Second), recv},
		{"30 days ahead", recv.AddDate(0, 0, 30), recv},
		{"300 years ahead", recv.AddDate(300, 0, 0), recv},
		{"4m behind", recv.Add(-4 * time.Minute), recv.Add(-4 * time.Minute)},
		{"an hour behind", recv.Add(-time.Hour), recv.Add(-tol)},
		{"30 days behind", recv.AddDate(0, 0, -30), recv.Add(-tol)},
		{"no timestamp", time.Time{}, recv},
	} {
		if got := novaTime(InboxRow{OccurredAt: c.occurred, ReceivedAt: recv}, tol); !got.Equal(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// The policy's clock for a row: a sender's time never after the bridge's
// receipt, Nova's novaTime, the bridge's own as it is.
func TestEventTime(t *testing.T) {
	recv := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	const tol = 5 * time.Minute
	hourAgo, farAhead := recv.Add(-time.Hour), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name, source   string
		occurred, want time.Time
	}{
		{"alert started an hour ago", "webhook:am", hourAgo, hourAgo},
		{"alert stamped in 9999", "webhook:am", farAhead, recv},
		{"nova an hour behind", "nova", hourAgo, recv.Add(-tol)},
		{"nova in 9999", "nova", farAhead, recv},
		{"the bridge's own", BridgeSource, hourAgo, hourAgo},
	} {
		if got := eventTime(InboxRow{Source: c.source, OccurredAt: c.occurred, ReceivedAt: recv}, tol); !got.Equal(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
