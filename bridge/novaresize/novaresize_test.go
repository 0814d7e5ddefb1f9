package novaresize

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// TestSoleType: a flavor asking for VGPU without a trait is chosen only
// when every GPU that could serve it offers exactly the wanted type.
func TestSoleType(t *testing.T) {
	const t4q = "CUSTOM_NVIDIA_232"
	gpu := func(class string, total int, types ...string) engine.GPU {
		return engine.GPU{Class: class, Inventory: engine.Inventory{Total: total, MaxUnit: total, StepSize: 1, AllocationRatio: 1}, Types: types}
	}
	tests := []struct {
		name string
		gpus []engine.GPU
		want bool
	}{
		{"one type everywhere", []engine.GPU{gpu("VGPU", 4, t4q), gpu("VGPU", 4, t4q)}, true},
		{"another type somewhere", []engine.GPU{gpu("VGPU", 4, t4q), gpu("VGPU", 2, "CUSTOM_NVIDIA_233")}, false},
		{"a GPU of unknown type", []engine.GPU{gpu("VGPU", 4, t4q), gpu("VGPU", 4)}, false},
		{"a GPU with two type traits", []engine.GPU{gpu("VGPU", 4, t4q, "CUSTOM_NVIDIA_233")}, false},
		{"other classes and empty GPUs do not count", []engine.GPU{gpu("VGPU", 4, t4q), gpu("CUSTOM_X", 4, "CUSTOM_NVIDIA_233"),
			gpu("VGPU", 0, "CUSTOM_NVIDIA_233")}, true},
		{"no GPU", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := soleType(tc.gpus, t4q); got != tc.want {
				t.Errorf("soleType = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDecodeNovaPayload reads what the Nova path needs from Nova's own
// notification samples (nova/testdata/notification_samples).
func TestDecodeNovaPayload(t *testing.T) {
	tests := []struct {
		sample, host, flavor string
		reasonHas            string
	}{
		{sample: "instance-resize_finish-end", host: "compute", flavor: "other_flavor"},
		{sample: "instance-resize_confirm-end", host: "compute", flavor: "m1.small"},
		{sample: "compute_task-migrate_server-error", reasonHas: "NoValidHost: No valid host was found."},
		{sample: "instance-resize_prep-end", host: "compute", flavor: "test_flavor"},
	}
	for _, tc := range tests {
		t.Run(tc.sample, func(t *testing.T) {
			b, err := novatest.ResolveFile(filepath.Join("..", "..", "nova", "testdata", "notification_samples", tc.sample+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var m struct {
				Payload json.RawMessage `json:"payload"`
			}
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			got := decodeNovaPayload(m.Payload)
			if got.host != tc.host || got.flavor != tc.flavor || !strings.Contains(got.reason, tc.reasonHas) {
				t.Errorf("got host %q flavor %q reason %q; want %q %q, reason with %q", got.host, got.flavor, got.reason, tc.host, tc.flavor, tc.reasonHas)
			}
		})
	}
	if got := decodeNovaPayload(json.RawMessage(`{"nope": 1}`)); got.host != "" || got.reason != "" {
		t.Errorf("garbage decoded to %+v", got)
	}
}

func TestNovaRequestID(t *testing.T) {
	if NovaRequestID(uuid.MustParse("5c1d2a39-4f4e-4d0e-9b8f-2f6d3c8e1a00")) != "req-5c1d2a39-4f4e-4d0e-9b8f-2f6d3c8e1a00" {
		t.Error("NovaRequestID")
	}
}

// TestStillOn: a move whose verified vGPU is on the GPU it had to leave,
// on the source host, is named; another GPU, another host, another kind
// of resize or details without vGPUs are not.
func TestStillOn(t *testing.T) {
	move := resizeRow{Kind: KindMove, SourceHost: "cmp1", LeaveGPU: "0000:3b:00.0"}
	details := func(parents ...string) json.RawMessage {
		var vs []map[string]string
		for _, p := range parents {
			vs = append(vs, map[string]string{"device": "mdev", "parent": p})
		}
		b, _ := json.Marshal(map[string]any{"vgpus": vs, "healthy": len(vs)})
		return b
	}
	resize := move
	resize.Kind = KindResize
	tests := []struct {
		name    string
		r       resizeRow
		host    string
		details json.RawMessage
		want    bool
	}{
		{"back on the GPU left", move, "cmp1", details("0000:3B:00.0"), true},
		{"another GPU of the host", move, "cmp1", details("0000:d8:00.0"), false},
		{"another host", move, "cmp2", details("0000:3b:00.0"), false},
		{"a resize, not a move", resize, "cmp1", details("0000:3b:00.0"), false},
		{"no details", move, "cmp1", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := stillOn(tt.r, tt.host, tt.details)
			if (got != "") != tt.want || (tt.want && !strings.Contains(got, "0000:3b:00.0")) {
				t.Errorf("stillOn = %q, want named: %v", got, tt.want)
			}
		})
	}
}
