package computeapi

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// Want is the vGPU a resize must give: Count units of VGPU whose provider
// carries Trait (CUSTOM_NVIDIA_232), for the profile Profile (T4-4Q).
type Want struct {
	Profile string
	Trait   string
	Count   int
	// Untyped: a flavor asking for VGPU without any trait serves too. Set
	// it only when every GPU provider that could serve such a flavor
	// offers the wanted type (Nova's scheduler would pick any of them).
	Untyped bool
}

// ErrNoFlavor says no flavor fits; the error's text names the flavor an
// operator should create.
var ErrNoFlavor = errors.New("no flavor carries the wanted vGPU")

// NoFlavorError is ErrNoFlavor with what to create.
type NoFlavorError struct {
	Current Flavor
	Want    Want
	// Suggested is the flavor to create: the current sizes, a name and
	// the extra specs.
	Suggested Flavor
}

func (e *NoFlavorError) Error() string {
	s := e.Suggested
	keys := make([]string, 0, len(s.ExtraSpecs))
	for k := range s.ExtraSpecs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var props, specs []string
	for _, k := range keys {
		specs = append(specs, k+"="+s.ExtraSpecs[k])
		props = append(props, "--property "+k+"="+s.ExtraSpecs[k])
	}
	return fmt.Sprintf("no flavor has vcpus=%d, ram=%d MB, disk=%d GB and extra specs %s (the sizes of the instance's flavor %s, plus %d × %s); "+
		"create it, e.g.: openstack flavor create --vcpus %d --ram %d --disk %d%s %s %s",
		s.VCPUs, s.RAM, s.Disk, strings.Join(specs, ", "), orQuote(e.Current.Name), e.Want.Count, e.Want.Profile,
		s.VCPUs, s.RAM, s.Disk, extraSizes(s), strings.Join(props, " "), s.Name)
}

func (e *NoFlavorError) Unwrap() error { return ErrNoFlavor }

func orQuote(s string) string {
	if s == "" {
		return "(unnamed)"
	}
	return s
}

func extraSizes(f Flavor) string {
	var b strings.Builder
	if f.Ephemeral > 0 {
		fmt.Fprintf(&b, " --ephemeral %d", f.Ephemeral)
	}
	if f.Swap > 0 {
		fmt.Fprintf(&b, " --swap %d", f.Swap)
	}
	return b.String()
}

// CarriesVGPU reports whether f's extra specs ask for exactly w.Count
// VGPU in all, every VGPU request group (unsuffixed or granular
// resourcesN:VGPU) requiring w.Trait in the same group, so that Nova's
// scheduler can only place them on GPUs of the wanted type; group_policy
// says nothing about the type and is accepted as it is. With w.Untyped, a
// VGPU group that requires no trait at all also serves (the caller knows
// that every GPU that could serve it offers the wanted type). Malformed
// specs never carry.
func CarriesVGPU(f Flavor, w Want) bool {
	d, err := nova.ParseExtraSpecs(f.ExtraSpecs)
	if err != nil || d.VGPUs() != max(w.Count, 1) || len(d.CustomResources()) > 0 {
		return false
	}
	for _, g := range d.VGPUGroups() {
		if !slices.Contains(g.Required, w.Trait) && (!w.Untyped || len(g.Required) > 0) {
			return false
		}
	}
	return true
}

// typed reports whether every VGPU group of f requires w.Trait.
func typed(f Flavor, w Want) bool {
	w.Untyped = false
	return CarriesVGPU(f, w)
}

// HasVGPU reports whether f's extra specs ask for any vGPU (VGPU or an
// mdev custom resource class); malformed specs count as asking for one.
func HasVGPU(f Flavor) bool {
	d, err := nova.ParseExtraSpecs(f.ExtraSpecs)
	return err != nil || d.HasVGPU()
}

// ChooseFlavor picks the flavor to resize an instance on current to: the
// same vCPUs, RAM and disk, not disabled, carrying the wanted vGPU. Among
// several, it prefers one that names the type (over an untyped one, when
// w.Untyped allows those), then the same ephemeral and swap, then the
// same other extra specs as current, then a public one, then the first
// name. When
// none fits it returns a *NoFlavorError naming the flavor to create.
func ChooseFlavor(current Flavor, all []Flavor, w Want) (Flavor, error) {
	if w.Trait == "" {
		return Flavor{}, fmt.Errorf("%w: profile %s has no Placement trait", ErrNoFlavor, w.Profile)
	}
	base := otherSpecs(current.ExtraSpecs)
	type scored struct {
		f     Flavor
		score int
	}
	var fits []scored
	for _, f := range all {
		if f.Disabled || f.VCPUs != current.VCPUs || f.RAM != current.RAM || f.Disk != current.Disk || !CarriesVGPU(f, w) {
			continue
		}
		s := likeness(f, current, base)
		if typed(f, w) {
			s += 8 // the type is in the flavor: it cannot land elsewhere
		}
		fits = append(fits, scored{f, s})
	}
	if len(fits) == 0 {
		return Flavor{}, &NoFlavorError{Current: current, Want: w, Suggested: Suggest(current, w)}
	}
	sort.SliceStable(fits, func(i, j int) bool {
		if fits[i].score != fits[j].score {
			return fits[i].score > fits[j].score
		}
		return fits[i].f.Name < fits[j].f.Name
	})
	return fits[0].f, nil
}

// Suggest is the flavor an operator should create for w: current's sizes
// and its extra specs other than vGPU ones, plus resources:VGPU and the
// type trait.
func Suggest(current Flavor, w Want) Flavor {
	specs := otherSpecs(current.ExtraSpecs)
	specs["resources:VGPU"] = fmt.Sprint(max(w.Count, 1))
	specs["trait:"+w.Trait] = "required"
	name := orDefault(current.Name, fmt.Sprintf("c%d-r%d-d%d", current.VCPUs, current.RAM, current.Disk)) + ".vgpu-" + strings.ToLower(orDefault(w.Profile, w.Trait))
	if w.Count > 1 {
		name += fmt.Sprintf("x%d", w.Count)
	}
	return Flavor{Name: name, VCPUs: current.VCPUs, RAM: current.RAM, Disk: current.Disk, Ephemeral: current.Ephemeral, Swap: current.Swap,
		ExtraSpecs: specs}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// likeness scores how much f is like current beyond the sizes that must
// match: the same ephemeral and swap (4), the same other extra specs
// (base, current's otherSpecs: 2), and public (1).
func likeness(f, current Flavor, base map[string]string) int {
	s := 0
	if f.Ephemeral == current.Ephemeral && f.Swap == current.Swap {
		s += 4
	}
	if maps.Equal(otherSpecs(f.ExtraSpecs), base) {
		s += 2
	}
	if f.Public {
		s++
	}
	return s
}

// otherSpecs are the extra specs that say nothing about Placement's
// resources and traits (hw:*, aggregate_instance_extra_specs:*, …) nor
// to the bridge (vgpu_bridge:*).
func otherSpecs(specs map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range specs {
		if strings.HasPrefix(k, "resources") || strings.HasPrefix(k, "trait") || k == "group_policy" || strings.HasPrefix(k, SpecPrefix) {
			continue
		}
		out[k] = v
	}
	return out
}

// SpecPrefix starts the extra specs the bridge reads.
const SpecPrefix = "vgpu_bridge:"

// ReleaseFlavorSpec is the extra spec of a vGPU flavor that names (by
// name or id) the flavor a release resizes its servers to; without it the
// bridge picks the flavor of the same sizes without vGPU.
const ReleaseFlavorSpec = SpecPrefix + "release_flavor"

// NoReleaseFlavorError says no flavor without vGPU fits a release;
// its text says what to create or set.
type NoReleaseFlavorError struct {
	Current   Flavor
	Named     string // the flavor ReleaseFlavorSpec names, when it does
	Problem   string // what is wrong with the named flavor
	Suggested Flavor
}

func (e *NoReleaseFlavorError) Error() string {
	if e.Named != "" {
		return fmt.Sprintf("flavor %s names %s=%s, which %s; fix the extra spec, e.g.: openstack flavor set --property %s=<flavor without vGPU> %s",
			orQuote(e.Current.Name), ReleaseFlavorSpec, e.Named, e.Problem, ReleaseFlavorSpec, orQuote(e.Current.Name))
	}
	s := e.Suggested
	keys := slices.Sorted(maps.Keys(s.ExtraSpecs))
	var props, specs []string
	for _, k := range keys {
		specs = append(specs, k+"="+s.ExtraSpecs[k])
		props = append(props, " --property "+k+"="+s.ExtraSpecs[k])
	}
	with := ""
	if len(specs) > 0 {
		with = " and extra specs " + strings.Join(specs, ", ")
	}
	return fmt.Sprintf("no flavor without vGPU has vcpus=%d, ram=%d MB, disk=%d GB%s (the sizes of the instance's flavor %s); "+
		"create it, e.g.: openstack flavor create --vcpus %d --ram %d --disk %d%s%s %s; "+
		"or name the flavor to release to: openstack flavor set --property %s=<flavor> %s",
		s.VCPUs, s.RAM, s.Disk, with, orQuote(e.Current.Name), s.VCPUs, s.RAM, s.Disk, extraSizes(s), strings.Join(props, ""), s.Name,
		ReleaseFlavorSpec, orQuote(e.Current.Name))
}

func (e *NoReleaseFlavorError) Unwrap() error { return ErrNoFlavor }

// ChooseReleaseFlavor picks the flavor that gives a server on current its
// vGPU back: the one current's ReleaseFlavorSpec names (by id, else by
// name), which must exist, be enabled and ask for no vGPU; otherwise the
// flavor of the same vCPUs, RAM and disk without vGPU, preferring the
// same ephemeral and swap, then the same other extra specs, then a public
// one, then the first name. When none fits it returns a
// *NoReleaseFlavorError saying what to create.
func ChooseReleaseFlavor(current Flavor, all []Flavor) (Flavor, error) {
	if named := strings.TrimSpace(current.ExtraSpecs[ReleaseFlavorSpec]); named != "" {
		var found *Flavor
		for i := range all {
			if all[i].ID == named {
				found = &all[i]
				break
			}
			if all[i].Name == named && found == nil {
				found = &all[i]
			}
		}
		switch {
		case found == nil:
			return Flavor{}, &NoReleaseFlavorError{Current: current, Named: named, Problem: "does not exist (or is not visible to the bridge)"}
		case found.Disabled:
			return Flavor{}, &NoReleaseFlavorError{Current: current, Named: named, Problem: "is disabled"}
		case HasVGPU(*found):
			return Flavor{}, &NoReleaseFlavorError{Current: current, Named: named, Problem: "asks for a vGPU too"}
		}
		return *found, nil
	}
	base := otherSpecs(current.ExtraSpecs)
	var best Flavor
	bestScore := -1
	for _, f := range all {
		if f.Disabled || f.VCPUs != current.VCPUs || f.RAM != current.RAM || f.Disk != current.Disk || HasVGPU(f) {
			continue
		}
		s := likeness(f, current, base)
		if s > bestScore || (s == bestScore && f.Name < best.Name) {
			best, bestScore = f, s
		}
	}
	if bestScore < 0 {
		name := orDefault(current.Name, fmt.Sprintf("c%d-r%d-d%d", current.VCPUs, current.RAM, current.Disk))
		if i := strings.Index(name, ".vgpu-"); i > 0 {
			name = name[:i]
		} else {
			name += ".novgpu"
		}
		return Flavor{}, &NoReleaseFlavorError{Current: current, Suggested: Flavor{Name: name, VCPUs: current.VCPUs, RAM: current.RAM,
			Disk: current.Disk, Ephemeral: current.Ephemeral, Swap: current.Swap, ExtraSpecs: base}}
	}
	return best, nil
}
