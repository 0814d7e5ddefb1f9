package maintenance

import (
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// TestIndexChooserPlaceable: the chooser takes the first host by name with
// room for the vGPUs, the source excluded, and never a host the bridge
// does not place on (no agent, drained, disabled, silent).
func TestIndexChooserPlaceable(t *testing.T) {
	const trait = "CUSTOM_NVIDIA_232"
	gpu := func(host string, total, used int) engine.GPU {
		return engine.GPU{UUID: host + "-gpu", Host: &engine.Host{Name: host}, Inventory: engine.Inventory{Total: total, AllocationRatio: 1, MaxUnit: total, StepSize: 1, MinUnit: 1},
			Used: used, Types: []string{trait}}
	}
	gpus := []engine.GPU{gpu("a-other-test", 4, 0), gpu("b-full", 4, 4), gpu("c-source", 4, 1), gpu("d-target", 4, 0)}
	need := []DirectVGPU{{Trait: trait, Amount: 1}}
	for _, tc := range []struct {
		name      string
		placeable func(string) bool
		want      string
	}{
		{"every host placeable", nil, "a-other-test"},
		{"a host without an agent is no target", func(n string) bool { return n != "a-other-test" }, "d-target"},
		{"none placeable", func(string) bool { return false }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &IndexChooser{GPUs: func() []engine.GPU { return gpus }, Placeable: tc.placeable}
			got, err := c.ChooseHost(need, []string{"c-source"})
			if got != tc.want || (tc.want == "") != (err != nil) {
				t.Errorf("ChooseHost = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
