package computeapi

import (
	"errors"
	"fmt"
	"maps"
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

// CarriesVGPU reports whether f's extra specs ask for exactly w.Count VGPU
// in one request group that requires w.Trait (or, when the VGPU is in the
// unsuffixed group, an unsuffixed trait:w.Trait=required). Malformed specs
// never carry.
func CarriesVGPU(f Flavor, w Want) bool {
	d, err := nova.ParseExtraSpecs(f.ExtraSpecs)
	if err != nil || d.VGPUs() != max(w.Count, 1) {
		return false
	}
	for _, g := range d.VGPUGroups() {
		if g.Resources[nova.ResourceVGPU] != max(w.Count, 1) {
			continue
		}
		for _, t := range g.Required {
			if t == w.Trait {
				return true
			}
		}
	}
	return false
}

// ChooseFlavor picks the flavor to resize an instance on current to: the
// same vCPUs, RAM and disk, not disabled, carrying the wanted vGPU. Among
// several, it prefers the same ephemeral and swap, then the same other
// extra specs as current, then a public one, then the first name. When
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

// otherSpecs are the extra specs that say nothing about Placement's
// resources and traits (hw:*, aggregate_instance_extra_specs:*, …).
func otherSpecs(specs map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range specs {
		if strings.HasPrefix(k, "resources") || strings.HasPrefix(k, "trait") || k == "group_policy" {
			continue
		}
		out[k] = v
	}
	return out
}
