package sysfs

import (
	"regexp"
	"strings"
)

// migName matches the profile part of a MIG-backed vGPU type's name:
// board, compute slices, framebuffer in GB and class ("A100-1-5C",
// "H100XM-2-20C", "A30-1-6CME"). A time-sliced type has no slice count
// ("A100-4C", "T4-4Q", "L40S-48Q").
var migName = regexp.MustCompile(`^[A-Z0-9]+-([0-9]+)-([0-9]+)[A-Z]+$`)

// MIGBacked reports whether a vGPU type, by its name as sysfs or
// creatable_vgpu_types gives it ("GRID A100-1-5C", "NVIDIA H100-2-20C"),
// is backed by a MIG GPU instance rather than time-sliced. Such a type can
// be created only on a GPU in MIG mode with a free GPU instance of its
// size, which something else must make first.
func MIGBacked(name string) bool {
	f := strings.Fields(name)
	if len(f) == 0 {
		return false
	}
	return migName.MatchString(f[len(f)-1])
}

// MIGRefusal is why the agent offers no MIG-backed type and creates no
// vGPU of one: vgpu-bridge makes no MIG GPU instances.
const MIGRefusal = "MIG-backed vGPU type: it needs a MIG GPU instance, which vgpu-bridge does not create; use a time-sliced type"
