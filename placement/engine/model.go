// Package engine is the placement decision engine: pure logic that ranks the
// physical GPUs able to hold a vGPU request. It reads the fleet through the
// State interface (an in-memory index in production, see placement/index)
// and never does I/O, so it is tested against a brute-force reference.
//
// Model: a physical GPU is a resource provider with an inventory of a vGPU
// resource class (VGPU, or a configured CUSTOM_* class); its host is the
// root provider of its tree (the compute node); its vGPU type is its
// CUSTOM_NVIDIA_* trait. NVIDIA time-sliced vGPU holds one type per
// physical GPU, so a GPU carrying several type traits is only usable while
// it is empty.
package engine

import (
	"math"
	"sort"
	"strings"
)

// DefaultTypePrefix is the trait prefix that marks a vGPU type trait
// ("CUSTOM_" + upper-cased type id, as Nova names them).
const DefaultTypePrefix = "CUSTOM_NVIDIA_"

// Inventory is one resource class's inventory on a provider, as Placement
// reports it.
type Inventory struct {
	Total           int     `json:"total"`
	Reserved        int     `json:"reserved"`
	MinUnit         int     `json:"min_unit"`
	MaxUnit         int     `json:"max_unit"`
	StepSize        int     `json:"step_size"`
	AllocationRatio float64 `json:"allocation_ratio"`
}

// Capacity is what Placement lets consumers allocate:
// floor((total − reserved) × allocation_ratio).
func (inv Inventory) Capacity() int {
	r := inv.AllocationRatio
	if r <= 0 {
		r = 1
	}
	c := float64(inv.Total-inv.Reserved) * r
	// Placement compares floats; tolerate the representation error of
	// ratios such as 1.1 before flooring.
	c = math.Floor(c + 1e-9)
	if c < 0 {
		return 0
	}
	return int(c)
}

// Provider is one resource provider as mirrored from Placement.
type Provider struct {
	UUID       string               `json:"uuid"`
	Name       string               `json:"name"`
	Generation int                  `json:"generation"`
	ParentUUID string               `json:"parent_provider_uuid,omitempty"`
	RootUUID   string               `json:"root_provider_uuid"`
	Inventory  map[string]Inventory `json:"inventories,omitempty"`
	Usages     map[string]int       `json:"usages,omitempty"`
	Traits     []string             `json:"traits,omitempty"`
	Aggregates []string             `json:"aggregates,omitempty"`
	// Allocations on the provider by consumer, then class; mirrored for
	// vGPU providers only.
	Allocations map[string]map[string]int `json:"allocations,omitempty"`
}

// IsRoot reports whether p is the root of its tree.
func (p *Provider) IsRoot() bool { return p.RootUUID == "" || p.RootUUID == p.UUID }

// Host is a compute node: the root provider of a tree holding GPUs.
type Host struct {
	Name     string   // root provider name (the hypervisor node name)
	RootUUID string   // root provider uuid
	Traits   []string // root provider traits, sorted; shared with other hosts': read-only
}

// HasTrait reports whether the host carries t.
func (h *Host) HasTrait(t string) bool { return hasSorted(h.Traits, t) }

// GPU is a physical GPU: a provider with vGPU inventory. Fields are
// read-only for the engine. (The index keeps one per GPU of the fleet:
// TypeFromReport sits beside ID, in ID's padding, so that a GPU takes 176
// bytes, not 192.) Traits and Types may share their backing array with
// other GPUs': never append to them or write into them.
type GPU struct {
	ID int32 // dense, stable while the GPU exists; ties rank by ID
	// TypeFromReport: the GPU's provider has no type trait in Placement;
	// its one type trait in Traits and Types is the one its host's agent
	// reports (the direct path can place on it; Nova's scheduler cannot).
	TypeFromReport bool
	UUID           string
	Name           string
	Host           *Host
	Class          string    // resource class of its vGPU inventory
	Inventory      Inventory // of Class
	Used           int       // of Class
	Generation     int
	Traits         []string // own traits, sorted
	Types          []string // the vGPU type traits among Traits
}

// Capacity is the allocatable amount of the GPU's vGPU class.
func (g *GPU) Capacity() int { return g.Inventory.Capacity() }

// Free is capacity minus usage, never negative.
func (g *GPU) Free() int {
	f := g.Capacity() - g.Used
	if f < 0 {
		return 0
	}
	return f
}

// Usable reports whether the time-sliced rule lets the GPU take new vGPUs of
// its types: a GPU with several type traits is only usable while empty,
// because the type in use is then unknown.
func (g *GPU) Usable() bool { return len(g.Types) <= 1 || g.Used == 0 }

// Fits reports whether n units fit now, honouring min_unit, max_unit and
// step_size as Placement does.
func (g *GPU) Fits(n int) bool {
	return unitsOK(g.Inventory, n) && n <= g.Free()
}

func unitsOK(inv Inventory, n int) bool {
	if n < 1 || n < inv.MinUnit {
		return false
	}
	if inv.MaxUnit > 0 && n > inv.MaxUnit {
		return false
	}
	if inv.StepSize > 1 && n%inv.StepSize != 0 {
		return false
	}
	return true
}

// HasTrait reports whether the GPU itself carries t.
func (g *GPU) HasTrait(t string) bool { return hasSorted(g.Traits, t) }

// PCIAddress derives the PCI address from Nova's provider name
// "<node>_pci_0000_84_00_0" → "0000:84:00.0"; "" if the name has another form.
func (g *GPU) PCIAddress() string { return PCIAddress(g.Name) }

// PCIAddress parses Nova's pGPU provider name suffix "_pci_DDDD_BB_SS_F",
// or the suffix "_DDDD:BB:SS.F" of the provider Nova's PCI tracker makes
// for a PF's VFs (nova.compute.pci_placement_translator: the address
// upper-cased), which it returns lower-cased.
func PCIAddress(name string) string {
	i := strings.LastIndex(name, "_pci_")
	if i < 0 {
		return pciTrackerAddress(name)
	}
	parts := strings.Split(name[i+5:], "_")
	if len(parts) != 4 {
		return ""
	}
	for _, p := range parts {
		if p == "" {
			return ""
		}
		for _, c := range p {
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return ""
			}
		}
	}
	return parts[0] + ":" + parts[1] + ":" + parts[2] + "." + parts[3]
}

func hasSorted(s []string, t string) bool {
	i := sort.SearchStrings(s, t)
	return i < len(s) && s[i] == t
}

// pciTrackerAddress parses the "_DDDD:BB:SS.F" suffix of a provider Nova's
// PCI tracker made; "" for another form.
func pciTrackerAddress(name string) string {
	i := strings.LastIndex(name, "_")
	if i < 0 || len(name)-i-1 != len("0000:00:00.0") {
		return ""
	}
	a := strings.ToLower(name[i+1:])
	for k, c := range a {
		switch k {
		case 4, 7:
			if c != ':' {
				return ""
			}
		case 10:
			if c != '.' {
				return ""
			}
		default:
			if !strings.ContainsRune("0123456789abcdef", c) {
				return ""
			}
		}
	}
	return a
}
