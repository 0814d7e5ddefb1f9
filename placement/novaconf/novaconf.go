// SPDX-License-Identifier: Apache-2.0

// Package novaconf works out the nova.conf change that re-types
// Nova-owned mdev GPUs of one compute host: the whole [devices]
// enabled_mdev_types line and every [mdev_<type>] device_addresses
// section after the change, from what the bridge knows of the host (its
// agent's report: each GPU's PCI address, its current type and the types
// it can create; the GPU providers Nova wrote in Placement).
//
// The semantics are Nova 26's libvirt driver's
// (nova/virt/libvirt/driver.py LibvirtDriver._get_supported_vgpu_types and
// _get_vgpu_type_per_pgpu, options in nova/conf/devices.py):
//
//   - with one type in [devices] enabled_mdev_types every physical GPU
//     offers it, listed in a [mdev_<type>] section or not
//     (_get_vgpu_type_per_pgpu returns supported_vgpu_types[0]);
//   - with several, each type needs a [mdev_<type>] device_addresses
//     group, else Nova falls back to the first type only, for every GPU
//     (the "Only the first type ... will be used" warning), and a GPU
//     gets the type whose device_addresses list it (pgpu_type_mapping),
//     none when no group lists it;
//   - an address listed in two groups stops nova-compute
//     (InvalidLibvirtMdevConfig "duplicate types for PCI ID").
//
// So the change this package writes lists every type in use after the
// re-type and every GPU in exactly one group: it holds with one type as
// with several, whatever the host's nova.conf held before.
package novaconf

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// GPU is one Nova-owned mdev GPU of a host as the bridge knows it.
type GPU struct {
	PCI          string   // 0000:3b:00.0
	Type         string   // its current type ("nvidia-232"), "" when none is enabled on it
	Provider     string   // its Placement provider's name (<node>_pci_0000_3b_00_0)
	ProviderUUID string   // "" when the mirror has none
	Trait        string   // its provider's type trait now ("" when none)
	InUse        int      // vGPUs on it (the agent's report)
	Creatable    []string // the types it can create (the agent's report)
}

// Retype is one GPU's change.
type Retype struct {
	PCI          string `json:"pci_address"`
	From         string `json:"from_type,omitempty"`
	To           string `json:"to_type"`
	Provider     string `json:"provider"`
	ProviderUUID string `json:"provider_uuid,omitempty"`
	FromTrait    string `json:"from_trait,omitempty"`
	ToTrait      string `json:"to_trait"`
}

// Section is one [mdev_<type>] group after the change.
type Section struct {
	Type            string   `json:"type"`
	DeviceAddresses []string `json:"device_addresses"`
}

// Change is the nova.conf change of one host.
type Change struct {
	Host             string    `json:"host"`
	GPUs             []Retype  `json:"gpus"`
	EnabledMdevTypes []string  `json:"enabled_mdev_types"`
	Sections         []Section `json:"mdev_sections"`
	// Text is the [devices] and [mdev_<type>] sections of nova.conf
	// after the change, whole (they replace the host's).
	Text string `json:"nova_conf"`
}

// Errors of Compute.
var (
	ErrNotNovaGPU    = errors.New("not a Nova-owned mdev GPU of the host")
	ErrNotCreatable  = errors.New("type not creatable on the GPU")
	ErrInUse         = errors.New("GPU has vGPUs in use")
	ErrNoChange      = errors.New("GPU has the type already")
	ErrTypeMalformed = errors.New("not an mdev type name")
)

// Compute returns the change that gives each GPU of want (PCI address →
// type) its type on host, the other GPUs keeping theirs; traitFor names
// a type's Placement trait (catalog.TraitFor). allowInUse skips the
// in-use refusal (a dry run's answer about an empty GPU cannot need it;
// a run refuses).
func Compute(host string, gpus []GPU, want map[string]string, traitFor func(string) string, allowInUse bool) (Change, error) {
	c := Change{Host: host, GPUs: []Retype{}}
	byPCI := map[string]GPU{}
	for _, g := range gpus {
		byPCI[strings.ToLower(g.PCI)] = g
	}
	pcis := make([]string, 0, len(want))
	for p := range want {
		pcis = append(pcis, p)
	}
	slices.Sort(pcis)
	typeOf := map[string]string{}
	for _, g := range gpus {
		if g.Type != "" {
			typeOf[strings.ToLower(g.PCI)] = g.Type
		}
	}
	for _, p := range pcis {
		to := want[p]
		g, ok := byPCI[strings.ToLower(p)]
		switch {
		case !ok:
			return Change{}, fmt.Errorf("%s/%s: %w", host, p, ErrNotNovaGPU)
		case !validType(to):
			return Change{}, fmt.Errorf("%q: %w", to, ErrTypeMalformed)
		case g.Type == to:
			return Change{}, fmt.Errorf("%s/%s is %s: %w", host, g.PCI, to, ErrNoChange)
		case !slices.Contains(g.Creatable, to):
			return Change{}, fmt.Errorf("%s/%s cannot create %s (it offers %s): %w", host, g.PCI, to,
				strings.Join(g.Creatable, ", "), ErrNotCreatable)
		case g.InUse > 0 && !allowInUse:
			return Change{}, fmt.Errorf("%s/%s holds %d vGPU(s) of %s; re-type an empty GPU: %w", host, g.PCI, g.InUse, g.Type, ErrInUse)
		}
		typeOf[strings.ToLower(g.PCI)] = to
		c.GPUs = append(c.GPUs, Retype{PCI: g.PCI, From: g.Type, To: to, Provider: g.Provider, ProviderUUID: g.ProviderUUID,
			FromTrait: g.Trait, ToTrait: traitFor(to)})
	}
	groups := map[string][]string{}
	for p, t := range typeOf {
		groups[t] = append(groups[t], p)
	}
	for t, ps := range groups {
		slices.Sort(ps)
		c.EnabledMdevTypes = append(c.EnabledMdevTypes, t)
	}
	slices.Sort(c.EnabledMdevTypes)
	for _, t := range c.EnabledMdevTypes {
		c.Sections = append(c.Sections, Section{Type: t, DeviceAddresses: groups[t]})
	}
	c.Text = c.render()
	return c, nil
}

// validType: an mdev type name Nova takes as a group name ([mdev_<type>]).
func validType(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func (c Change) render() string {
	var b strings.Builder
	var moves []string
	for _, g := range c.GPUs {
		moves = append(moves, fmt.Sprintf("%s %s -> %s", g.PCI, orNone(g.From), g.To))
	}
	fmt.Fprintf(&b, "# nova.conf of compute host %s after re-typing %s.\n", c.Host, strings.Join(moves, ", "))
	b.WriteString("# These sections replace the host's [devices] enabled_mdev_types and every [mdev_<type>]\n")
	b.WriteString("# device_addresses (keep any mdev_class option); restart nova-compute to apply.\n")
	b.WriteString("[devices]\n")
	fmt.Fprintf(&b, "enabled_mdev_types = %s\n", strings.Join(c.EnabledMdevTypes, ", "))
	for _, s := range c.Sections {
		fmt.Fprintf(&b, "\n[mdev_%s]\ndevice_addresses = %s\n", s.Type, strings.Join(s.DeviceAddresses, ","))
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "(no type)"
	}
	return s
}
