package nova

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ResourceVGPU is Placement's standard resource class for vGPUs.
const ResourceVGPU = "VGPU"

// MaxVGPUsPerInstance bounds the vGPUs one instance may ask for: in a
// flavor (VGPU and CUSTOM_* resources over all its groups) and in a
// request's count: 16, the most vGPUs NVIDIA's vGPU software assigns to
// one VM. More is a typo or an attack, never a placement to look for.
const MaxVGPUsPerInstance = 16

// isVGPUClass reports whether rc is a vGPU resource class: VGPU, or a
// custom class (how clouds model mdev types).
func isVGPUClass(rc string) bool { return rc == ResourceVGPU || strings.HasPrefix(rc, "CUSTOM_") }

// Demand is the Placement request a flavor's extra specs make: the
// unsuffixed group ("resources:", "trait:") and the granular groups
// ("resourcesN:", "traitN:"), plus group_policy. Only the keys Placement
// reads are parsed; hw:*, hw_video:* and the like are ignored.
type Demand struct {
	// Groups are sorted by suffix; the unsuffixed group, if any, comes first
	// with Suffix "".
	Groups []RequestGroup `json:"groups,omitempty"`
	// GroupPolicy is "", "none" or "isolate".
	GroupPolicy string `json:"group_policy,omitempty"`
}

// RequestGroup is one request group of a flavor.
type RequestGroup struct {
	Suffix    string         `json:"suffix,omitempty"`
	Resources map[string]int `json:"resources,omitempty"`
	Required  []string       `json:"required,omitempty"`
	Forbidden []string       `json:"forbidden,omitempty"`
}

// SpecError is a malformed extra spec: the key, its value and why.
type SpecError struct {
	Key    string
	Value  string
	Reason string
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("extra spec %q=%q: %s", e.Key, e.Value, e.Reason)
}

// VGPUs is the total number of VGPU resources the flavor asks for, over all
// groups.
func (d Demand) VGPUs() int {
	n := 0
	for _, g := range d.Groups {
		n += g.Resources[ResourceVGPU]
	}
	return n
}

// CustomResources sums the CUSTOM_* resource classes over all groups
// (clouds that model mdev classes as custom resource classes).
func (d Demand) CustomResources() map[string]int {
	var out map[string]int
	for _, g := range d.Groups {
		for rc, n := range g.Resources {
			if strings.HasPrefix(rc, "CUSTOM_") {
				if out == nil {
					out = map[string]int{}
				}
				out[rc] += n
			}
		}
	}
	return out
}

// HasVGPU reports whether the flavor asks for a VGPU or a custom resource
// class (an mdev class).
func (d Demand) HasVGPU() bool {
	return d.VGPUs() > 0 || len(d.CustomResources()) > 0
}

// VGPUGroups returns the groups that ask for VGPU or CUSTOM_* resources,
// with their traits: one entry per vGPU the placement engine must find.
func (d Demand) VGPUGroups() []RequestGroup {
	var out []RequestGroup
	for _, g := range d.Groups {
		if g.Resources[ResourceVGPU] > 0 {
			out = append(out, g)
			continue
		}
		for rc := range g.Resources {
			if strings.HasPrefix(rc, "CUSTOM_") {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// ParseExtraSpecs reads a flavor's extra specs as Nova does when it builds
// the Placement request: resources[N]:RC=amount, trait[N]:NAME=required|forbidden
// and group_policy=none|isolate. A malformed key or value gives a *SpecError
// naming both. An amount of 0 drops the resource, as in Nova.
func ParseExtraSpecs(specs map[string]string) (Demand, error) {
	var d Demand
	groups := map[string]*RequestGroup{}
	group := func(suffix string) *RequestGroup {
		g := groups[suffix]
		if g == nil {
			g = &RequestGroup{Suffix: suffix}
			groups[suffix] = g
		}
		return g
	}
	total, lastVGPUKey := 0, "" // vGPUs over all groups, and the last key asking for some
	// Iterate in key order so the first error is deterministic.
	keys := make([]string, 0, len(specs))
	for k := range specs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		val := specs[key]
		switch {
		case key == "group_policy":
			if val != "none" && val != "isolate" {
				return Demand{}, &SpecError{key, val, `want "none" or "isolate"`}
			}
			d.GroupPolicy = val
		case strings.HasPrefix(key, "resources"):
			prefix, rc, ok := strings.Cut(key, ":")
			if !ok {
				continue // e.g. "resources_foo": not a Placement key
			}
			suffix := prefix[len("resources"):]
			if err := checkSuffix(suffix); err != nil {
				return Demand{}, &SpecError{key, val, err.Error()}
			}
			if err := checkName(rc, "resource class"); err != nil {
				return Demand{}, &SpecError{key, val, err.Error()}
			}
			n, err := parseAmount(val)
			if err != nil {
				return Demand{}, &SpecError{key, val, err.Error()}
			}
			if n == 0 {
				continue
			}
			if isVGPUClass(rc) {
				if n > MaxVGPUsPerInstance {
					return Demand{}, &SpecError{key, val, fmt.Sprintf("at most %d vGPUs per instance (NVIDIA's maximum per VM)", MaxVGPUsPerInstance)}
				}
				total, lastVGPUKey = total+n, key
			}
			g := group(suffix)
			if g.Resources == nil {
				g.Resources = map[string]int{}
			}
			g.Resources[rc] = n
		case strings.HasPrefix(key, "trait"):
			prefix, name, ok := strings.Cut(key, ":")
			if !ok {
				continue
			}
			suffix := prefix[len("trait"):]
			if err := checkSuffix(suffix); err != nil {
				return Demand{}, &SpecError{key, val, err.Error()}
			}
			if err := checkName(name, "trait"); err != nil {
				return Demand{}, &SpecError{key, val, err.Error()}
			}
			g := group(suffix)
			switch val {
			case "required":
				g.Required = append(g.Required, name)
			case "forbidden":
				g.Forbidden = append(g.Forbidden, name)
			default:
				return Demand{}, &SpecError{key, val, `want "required" or "forbidden"`}
			}
		}
	}
	if total > MaxVGPUsPerInstance {
		return Demand{}, &SpecError{lastVGPUKey, specs[lastVGPUKey],
			fmt.Sprintf("the flavor asks for %d vGPUs over its groups; at most %d per instance (NVIDIA's maximum per VM)", total, MaxVGPUsPerInstance)}
	}
	for _, g := range groups {
		d.Groups = append(d.Groups, *g)
	}
	sort.Slice(d.Groups, func(i, j int) bool { return suffixLess(d.Groups[i].Suffix, d.Groups[j].Suffix) })
	return d, nil
}

// suffixLess sorts "" first, then numeric suffixes numerically, then the rest.
func suffixLess(a, b string) bool {
	na, ea := strconv.Atoi(a)
	nb, eb := strconv.Atoi(b)
	switch {
	case a == "" || b == "":
		return a == "" && b != ""
	case ea == nil && eb == nil:
		return na < nb
	case ea == nil:
		return true
	case eb == nil:
		return false
	}
	return a < b
}

// checkSuffix accepts Placement's granular suffixes: 1-64 of [a-zA-Z0-9_-].
func checkSuffix(s string) error {
	if s == "" {
		return nil
	}
	if len(s) > 64 {
		return fmt.Errorf("group suffix %q longer than 64 characters", s)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("group suffix %q: only letters, digits, '_' and '-' are allowed", s)
		}
	}
	return nil
}

// checkName accepts resource class and trait names: upper case letters,
// digits and '_', starting with a letter, at most 255 characters; "CUSTOM_"
// must be followed by a name.
func checkName(s, what string) error {
	if s == "" {
		return fmt.Errorf("empty %s", what)
	}
	if len(s) > 255 {
		return fmt.Errorf("%s %q longer than 255 characters", what, s)
	}
	for i, c := range s {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && i > 0 || c == '_' && i > 0) {
			return fmt.Errorf("%s %q: want upper case letters, digits and '_' (e.g. VGPU or CUSTOM_NVIDIA_232)", what, s)
		}
	}
	if s == "CUSTOM_" {
		return fmt.Errorf("%s %q: nothing after CUSTOM_", what, s)
	}
	return nil
}

func parseAmount(v string) (int, error) {
	if v == "" {
		return 0, fmt.Errorf("empty amount")
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("amount must be a non-negative integer")
		}
	}
	n, err := strconv.Atoi(v)
	if err != nil || n > 1<<30 {
		return 0, fmt.Errorf("amount out of range")
	}
	return n, nil
}
