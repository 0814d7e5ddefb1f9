package index

import (
	"fmt"
	"math/rand/v2"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// FleetTypes are the vGPU type traits SyntheticFleet uses, with the
// instances each type allows per physical GPU.
var FleetTypes = []struct {
	Trait string
	Max   int
}{
	{"CUSTOM_NVIDIA_222", 16}, // T4-1Q
	{"CUSTOM_NVIDIA_223", 8},  // T4-2Q
	{"CUSTOM_NVIDIA_232", 4},  // T4-4Q
	{"CUSTOM_NVIDIA_233", 2},  // T4-8Q
	{"CUSTOM_NVIDIA_473", 16}, // A16-1Q
	{"CUSTOM_NVIDIA_474", 8},  // A16-2Q
}

var rootTraits = []string{
	"COMPUTE_ACCELERATORS", "COMPUTE_DEVICE_TAGGING", "COMPUTE_GRAPHICS_MODEL_VGA",
	"COMPUTE_IMAGE_TYPE_QCOW2", "COMPUTE_IMAGE_TYPE_RAW", "COMPUTE_NET_ATTACH_INTERFACE",
	"COMPUTE_NODE", "COMPUTE_TRUSTED_CERTS", "COMPUTE_VOLUME_ATTACH_WITH_TAG",
	"COMPUTE_VOLUME_EXTEND", "HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_CPU_X86_SSE42",
	"HW_CPU_X86_AESNI", "HW_CPU_X86_FMA3", "HW_CPU_X86_BMI2",
}

// SyntheticFleet builds nodes compute nodes with gpus physical GPUs each, in
// Nova's shape: a root provider per node with VCPU/MEMORY_MB/DISK_GB, and a
// child provider "<node>_pci_0000_XX_00_0" per GPU with a VGPU inventory and
// one type trait. About one GPU in 20 is on a disabled node; usage is
// random. For benchmarks, demos and tests; the same seed gives the same fleet.
func SyntheticFleet(nodes, gpus int, seed uint64) []engine.Provider {
	r := rand.New(rand.NewPCG(seed, 7))
	ps := make([]engine.Provider, 0, nodes*(gpus+1))
	for n := 0; n < nodes; n++ {
		root := fmt.Sprintf("%08x-0000-4000-8000-%012x", n, seed)
		name := fmt.Sprintf("compute-%05d.example.org", n)
		traits := append([]string(nil), rootTraits...)
		if r.IntN(20) == 0 {
			traits = append(traits, "COMPUTE_STATUS_DISABLED")
		}
		ps = append(ps, engine.Provider{
			UUID: root, Name: name, RootUUID: root, Generation: 1, Traits: traits,
			Inventory: map[string]engine.Inventory{
				"VCPU":      {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4},
				"MEMORY_MB": {Total: 512000, Reserved: 4096, MinUnit: 1, MaxUnit: 512000, StepSize: 1, AllocationRatio: 1},
				"DISK_GB":   {Total: 2000, MinUnit: 1, MaxUnit: 2000, StepSize: 1, AllocationRatio: 1},
			},
		})
		for g := 0; g < gpus; g++ {
			ty := FleetTypes[r.IntN(len(FleetTypes))]
			used := 0
			if r.IntN(3) > 0 {
				used = r.IntN(ty.Max + 1)
			}
			ps = append(ps, engine.Provider{
				UUID:       fmt.Sprintf("%08x-%04x-4000-8000-%012x", n, g+1, seed),
				Name:       fmt.Sprintf("%s_pci_0000_%02x_00_0", name, 0x3b+g),
				Generation: 1, ParentUUID: root, RootUUID: root,
				Traits: []string{ty.Trait},
				Inventory: map[string]engine.Inventory{
					"VGPU": {Total: ty.Max, MinUnit: 1, MaxUnit: ty.Max, StepSize: 1, AllocationRatio: 1},
				},
				Usages: map[string]int{"VGPU": used},
			})
		}
	}
	return ps
}
