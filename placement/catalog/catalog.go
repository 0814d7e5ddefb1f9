package catalog

import (
	"fmt"
	"sort"
	"sync"
)

// Profile is one vGPU profile as the bridge knows it.
type Profile struct {
	Name           string `json:"name" yaml:"name"`                       // "T4-4Q"
	TypeID         string `json:"type_id,omitempty" yaml:"type_id"`       // "nvidia-232", or a vendor-VFIO id such as "1428"; empty while unknown
	Trait          string `json:"trait,omitempty" yaml:"trait"`           // "CUSTOM_NVIDIA_232"; empty while TypeID is
	FramebufferMiB int    `json:"framebuffer_mib" yaml:"framebuffer_mib"` // 4096
	MaxInstances   int    `json:"max_instances" yaml:"max_instances"`     // per physical GPU; 0 when unknown
	Series         Series `json:"series" yaml:"series"`                   // Q, C, B, A
	GPU            string `json:"gpu" yaml:"gpu"`                         // "T4"
	MIGSlices      int    `json:"mig_slices,omitempty" yaml:"mig_slices"` // 4 for A100-4-20C
	Source         Source `json:"source" yaml:"source"`                   // seed or report
}

// Source says where the catalog learned a profile.
type Source string

// Sources of profiles.
const (
	SourceSeed   Source = "seed"   // etc/vgpu-bridge/profiles.yaml
	SourceReport Source = "report" // an agent's report of what the driver exposes
)

// Catalog maps profile names, type ids and traits to profiles. It is safe for
// concurrent use. The zero value is not usable; call New.
type Catalog struct {
	mu      sync.RWMutex
	byName  map[string]Profile // canonical name → profile (its most recently learned type id)
	byType  map[string]Profile
	byTrait map[string]Profile
	version uint64 // bumped on every change
}

// New returns an empty catalog.
func New() *Catalog {
	return &Catalog{
		byName:  map[string]Profile{},
		byType:  map[string]Profile{},
		byTrait: map[string]Profile{},
	}
}

// NewProfile builds a profile from a type id (may be empty), a name as the
// driver or an operator writes it, and the instances per physical GPU (0 if
// unknown). Everything else is derived from the name.
func NewProfile(typeID, name string, maxInstances int) (Profile, error) {
	pn, err := ParseName(name)
	if err != nil {
		return Profile{}, err
	}
	if maxInstances < 0 {
		return Profile{}, fmt.Errorf("profile %s: max instances %d is negative", pn.Name, maxInstances)
	}
	p := Profile{
		Name:           pn.Name,
		TypeID:         typeID,
		FramebufferMiB: pn.FramebufferMiB,
		MaxInstances:   maxInstances,
		Series:         pn.Series,
		GPU:            pn.GPU,
		MIGSlices:      pn.MIGSlices,
		Source:         SourceSeed,
	}
	if typeID != "" {
		p.Trait = TraitFor(typeID)
	}
	return p, nil
}

// Add puts p into the catalog, replacing what was known for its name and
// type id. It returns an error if p has no valid name.
func (c *Catalog) Add(p Profile) error {
	if _, err := ParseName(p.Name); err != nil {
		return err
	}
	if p.TypeID != "" && p.Trait == "" {
		p.Trait = TraitFor(p.TypeID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addLocked(p)
	return nil
}

// IsNumericTypeID reports whether id is a bare number: NVML's vGPU type id
// ("230"), which is also a vendor-VFIO GPU's type id ("1428"), as opposed to
// a mediated-device type id ("nvidia-230").
func IsNumericTypeID(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' {
			return false
		}
	}
	return true
}

// keepsTypeID reports whether a name known with type id cur keeps it when
// told next: an mdev type id is never replaced by a numeric one, as Nova
// derives the trait of an mdev GPU from its mdev type id (an agent that
// falls back to NVML's ids would otherwise rename the trait).
func keepsTypeID(cur, next string) bool {
	return cur != "" && cur != next && !IsNumericTypeID(cur) && IsNumericTypeID(next)
}

func (c *Catalog) addLocked(p Profile) {
	if p.TypeID != "" && c.byType[p.TypeID] == p && c.byTrait[p.Trait] == p {
		if n, ok := c.byName[p.Name]; ok && (n == p || keepsTypeID(n.TypeID, p.TypeID)) {
			return // nothing new: keep Version, and so what callers derived from it
		}
	}
	c.version++
	if p.TypeID != "" {
		if old, ok := c.byType[p.TypeID]; ok && old.Name != p.Name {
			// The type id now means another profile (another driver
			// version): forget the old name's claim on it.
			if n, ok := c.byName[old.Name]; ok && n.TypeID == p.TypeID {
				n.TypeID, n.Trait = "", ""
				c.byName[old.Name] = n
			}
		}
		c.byType[p.TypeID] = p
		c.byTrait[p.Trait] = p
		if n, ok := c.byName[p.Name]; ok && keepsTypeID(n.TypeID, p.TypeID) {
			// The numeric id resolves to the profile (ByTypeID,
			// ByTrait), but the name keeps its mdev type id and trait.
			return
		}
	} else if old, ok := c.byName[p.Name]; ok && old.TypeID != "" {
		// Keep the known type id of a name we only learn more about.
		p.TypeID, p.Trait = old.TypeID, old.Trait
		if p.MaxInstances == 0 {
			p.MaxInstances = old.MaxInstances
		}
	}
	c.byName[p.Name] = p
}

// Observe records what an agent reported for a type id: its sysfs or NVML
// name ("GRID T4-4Q") and how many instances a GPU holds. A report
// overrides the seed, except that a name known with an mdev type id
// ("nvidia-230") keeps it, and its trait, when a numeric id ("230") is
// reported for it: the numeric id then only resolves to the profile. It
// returns the profile as recorded for typeID.
func (c *Catalog) Observe(typeID, name string, maxInstances int) (Profile, error) {
	if typeID == "" {
		return Profile{}, fmt.Errorf("observe %q: empty type id", name)
	}
	p, err := NewProfile(typeID, name, maxInstances)
	if err != nil {
		return Profile{}, fmt.Errorf("observe type %s: %w", typeID, err)
	}
	p.Source = SourceReport
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addLocked(p)
	return p, nil
}

// Merge adds every profile of o to c, o's entries winning.
func (c *Catalog) Merge(o *Catalog) {
	ps := o.Profiles()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		c.addLocked(p)
	}
	// Type-id entries that are no longer any name's canonical one.
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, p := range o.byType {
		c.byType[p.TypeID] = p
		c.byTrait[p.Trait] = p
	}
}

// ByName finds a profile by name, in any form ParseName accepts ("T4-4Q",
// "GRID T4-4Q", "t4-4q").
func (c *Catalog) ByName(name string) (Profile, bool) {
	c.mu.RLock()
	p, ok := c.byName[name]
	c.mu.RUnlock()
	if ok {
		return p, true
	}
	pn, err := ParseName(name)
	if err != nil {
		return Profile{}, false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok = c.byName[pn.Name]
	return p, ok
}

// ByTypeID finds a profile by type id ("nvidia-232").
func (c *Catalog) ByTypeID(typeID string) (Profile, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok := c.byType[typeID]
	return p, ok
}

// ByTrait finds a profile by Placement trait ("CUSTOM_NVIDIA_232").
func (c *Catalog) ByTrait(trait string) (Profile, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok := c.byTrait[trait]
	return p, ok
}

// Profiles returns every known profile name's entry, sorted by GPU, series,
// framebuffer and name.
func (c *Catalog) Profiles() []Profile {
	c.mu.RLock()
	out := make([]Profile, 0, len(c.byName))
	for _, p := range c.byName {
		out = append(out, p)
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if a.Series != b.Series {
			return a.Series < b.Series
		}
		if a.FramebufferMiB != b.FramebufferMiB {
			return a.FramebufferMiB < b.FramebufferMiB
		}
		return a.Name < b.Name
	})
	return out
}

// Len is the number of known profile names.
func (c *Catalog) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.byName)
}

// Version changes whenever the catalog does; callers cache derived data
// keyed by it.
func (c *Catalog) Version() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.version
}
