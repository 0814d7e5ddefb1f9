// SPDX-License-Identifier: Apache-2.0

package novaconf_test

import (
	"errors"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/novaconf"
)

var t4 = []string{"nvidia-222", "nvidia-223", "nvidia-232", "nvidia-234"}

func gpu(pci, typ string, inUse int) novaconf.GPU {
	return novaconf.GPU{PCI: pci, Type: typ, Provider: "cn1_pci_" + pci, Trait: catalog.TraitFor(typ), InUse: inUse, Creatable: t4}
}

// TestCompute: the whole [devices] and [mdev_<type>] text after the
// change, with Nova 26's semantics (one group per type in use, every GPU
// in exactly one group), for a single-type host going to two types, a
// two-type host, and back to one type; and the refusals.
func TestCompute(t *testing.T) {
	cases := []struct {
		name string
		gpus []novaconf.GPU
		want map[string]string
		text string
		err  error
	}{{
		name: "one type to two",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 1), gpu("0000:d8:00.0", "nvidia-232", 0)},
		want: map[string]string{"0000:d8:00.0": "nvidia-222"},
		text: `# nova.conf of compute host cn1 after re-typing 0000:d8:00.0 nvidia-232 -> nvidia-222.
# These sections replace the host's [devices] enabled_mdev_types and every [mdev_<type>]
# device_addresses (keep any mdev_class option); restart nova-compute to apply.
[devices]
enabled_mdev_types = nvidia-222, nvidia-232

[mdev_nvidia-222]
device_addresses = 0000:d8:00.0

[mdev_nvidia-232]
device_addresses = 0000:3b:00.0
`,
	}, {
		name: "two types, three GPUs, two re-typed",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 2), gpu("0000:5e:00.0", "nvidia-222", 0),
			gpu("0000:d8:00.0", "nvidia-222", 0), gpu("0000:af:00.0", "", 0)},
		want: map[string]string{"0000:5e:00.0": "nvidia-234", "0000:af:00.0": "nvidia-232"},
		text: `# nova.conf of compute host cn1 after re-typing 0000:5e:00.0 nvidia-222 -> nvidia-234, 0000:af:00.0 (no type) -> nvidia-232.
# These sections replace the host's [devices] enabled_mdev_types and every [mdev_<type>]
# device_addresses (keep any mdev_class option); restart nova-compute to apply.
[devices]
enabled_mdev_types = nvidia-222, nvidia-232, nvidia-234

[mdev_nvidia-222]
device_addresses = 0000:d8:00.0

[mdev_nvidia-232]
device_addresses = 0000:3b:00.0,0000:af:00.0

[mdev_nvidia-234]
device_addresses = 0000:5e:00.0
`,
	}, {
		name: "two types back to one",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 1), gpu("0000:d8:00.0", "nvidia-222", 0)},
		want: map[string]string{"0000:d8:00.0": "nvidia-232"},
		text: `# nova.conf of compute host cn1 after re-typing 0000:d8:00.0 nvidia-222 -> nvidia-232.
# These sections replace the host's [devices] enabled_mdev_types and every [mdev_<type>]
# device_addresses (keep any mdev_class option); restart nova-compute to apply.
[devices]
enabled_mdev_types = nvidia-232

[mdev_nvidia-232]
device_addresses = 0000:3b:00.0,0000:d8:00.0
`,
	}, {
		name: "in use",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 1)},
		want: map[string]string{"0000:3b:00.0": "nvidia-222"},
		err:  novaconf.ErrInUse,
	}, {
		name: "not creatable",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 0)},
		want: map[string]string{"0000:3b:00.0": "nvidia-999"},
		err:  novaconf.ErrNotCreatable,
	}, {
		name: "unknown GPU",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 0)},
		want: map[string]string{"0000:3c:00.0": "nvidia-222"},
		err:  novaconf.ErrNotNovaGPU,
	}, {
		name: "same type",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 0)},
		want: map[string]string{"0000:3b:00.0": "nvidia-232"},
		err:  novaconf.ErrNoChange,
	}, {
		name: "malformed type",
		gpus: []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 0)},
		want: map[string]string{"0000:3b:00.0": "nvidia 222]"},
		err:  novaconf.ErrTypeMalformed,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := novaconf.Compute("cn1", tc.gpus, tc.want, catalog.TraitFor, false)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if c.Text != tc.text {
				t.Errorf("text:\n%s\nwant:\n%s", c.Text, tc.text)
			}
			if len(c.GPUs) != len(tc.want) {
				t.Fatalf("gpus %+v", c.GPUs)
			}
			for _, g := range c.GPUs {
				if g.To != tc.want[g.PCI] || g.ToTrait != catalog.TraitFor(g.To) || g.Provider != "cn1_pci_"+g.PCI {
					t.Errorf("retype %+v", g)
				}
			}
		})
	}
}

// TestComputeInUseAllowed: a dry run's answer may describe a GPU the
// report shows in use (allowInUse) without refusing.
func TestComputeInUseAllowed(t *testing.T) {
	c, err := novaconf.Compute("cn1", []novaconf.GPU{gpu("0000:3b:00.0", "nvidia-232", 1)}, map[string]string{"0000:3b:00.0": "nvidia-222"},
		catalog.TraitFor, true)
	if err != nil || len(c.EnabledMdevTypes) != 1 || c.EnabledMdevTypes[0] != "nvidia-222" {
		t.Fatalf("%+v %v", c, err)
	}
}
