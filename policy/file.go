package policy

import (
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// AttachMode says who makes a vGPU change.
type AttachMode string

// Attach modes.
const (
	ModeNovaResize AttachMode = "nova-resize" // resize the server to a flavor with the vGPU (default)
	ModeDirectLive AttachMode = "direct-live" // the agent attaches to the running domain
	ModeDirectCold AttachMode = "direct-cold" // the agent attaches while the server is stopped
)

func parseMode(s string) (AttachMode, bool) {
	switch m := AttachMode(s); m {
	case ModeNovaResize, ModeDirectLive, ModeDirectCold:
		return m, true
	}
	return "", false
}

// Quota limits a project. Nil or empty fields inherit from the defaults;
// 0 means unlimited.
type Quota struct {
	MaxVGPUs          *int             `json:"max_vgpus,omitempty"`
	MaxFramebufferGiB *int             `json:"max_framebuffer_gib,omitempty"`
	MaxVGPUsPerVM     *int             `json:"max_vgpus_per_vm,omitempty"`
	AllowedSeries     []catalog.Series `json:"allowed_series,omitempty"`
	AllowedProfiles   []string         `json:"allowed_profiles,omitempty"`
}

// over returns q with o's set fields on top.
func (q Quota) over(o Quota) Quota {
	if o.MaxVGPUs != nil {
		q.MaxVGPUs = o.MaxVGPUs
	}
	if o.MaxFramebufferGiB != nil {
		q.MaxFramebufferGiB = o.MaxFramebufferGiB
	}
	if o.MaxVGPUsPerVM != nil {
		q.MaxVGPUsPerVM = o.MaxVGPUsPerVM
	}
	if o.AllowedSeries != nil {
		q.AllowedSeries = o.AllowedSeries
	}
	if o.AllowedProfiles != nil {
		q.AllowedProfiles = o.AllowedProfiles
	}
	return q
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// Choose says which end of the candidate list a preference takes.
type Choose string

// Choices.
const (
	ChooseLargest  Choose = "largest"
	ChooseSmallest Choose = "smallest"
)

// Preference is a workload's profile preference.
type Preference struct {
	Series            []catalog.Series `json:"series,omitempty"`   // allowed series, in no order
	Choose            Choose           `json:"choose"`             // largest or smallest that fits
	Profiles          []string         `json:"profiles,omitempty"` // explicit order: the first that fits wins
	MinFramebufferGiB int              `json:"min_framebuffer_gib,omitempty"`
	MaxFramebufferGiB int              `json:"max_framebuffer_gib,omitempty"`
	// FrameRateLimit, when set, turns NVIDIA's vGPU frame-rate limiter on
	// (true) or off (false) on the vGPUs the bridge creates; unset keeps
	// the driver's default.
	FrameRateLimit *bool `json:"frame_rate_limit,omitempty"`
}

// ProjectSpec is a project's overrides.
type ProjectSpec struct {
	AttachMode AttachMode            `json:"attach_mode,omitempty"`
	Quota      Quota                 `json:"quota"`
	Workloads  map[string]Preference `json:"workloads,omitempty"`
	Profiles   map[string]AttachMode `json:"profile_attach_modes,omitempty"`
}

// ruleSpec is a rule as written.
type ruleSpec struct {
	Name        string
	Description string
	On          []string
	When        string
	whenNode    *yaml.Node
	Then        []string
	thenNodes   []*yaml.Node
	For         time.Duration
	Cooldown    time.Duration
	cooldownSet bool
	Final       bool
	node        *yaml.Node
}

// spec is a parsed policy file before compilation.
type spec struct {
	AttachMode   AttachMode
	LoadCooldown time.Duration
	Quota        Quota
	Workloads    map[string]Preference
	ProfileModes map[string]AttachMode
	Projects     map[string]ProjectSpec
	Rules        []ruleSpec
}

// DefaultWorkloads are the workload preferences of a policy that names none.
func DefaultWorkloads() map[string]Preference {
	return map[string]Preference{
		"training":  {Series: []catalog.Series{catalog.SeriesC}, Choose: ChooseLargest},
		"inference": {Series: []catalog.Series{catalog.SeriesC}, Choose: ChooseSmallest},
		"rendering": {Series: []catalog.Series{catalog.SeriesQ}, Choose: ChooseSmallest},
		"vdi":       {Series: []catalog.Series{catalog.SeriesB, catalog.SeriesQ}, Choose: ChooseSmallest},
		"gaming":    {Series: []catalog.Series{catalog.SeriesQ}, Choose: ChooseSmallest, FrameRateLimit: ptr(true)},
	}
}

var topKeys = []string{"version", "defaults", "workloads", "profiles", "projects", "rules"}

func (w *walker) parseSpec(root *yaml.Node, cat *catalog.Catalog) *spec {
	s := &spec{
		AttachMode:   ModeNovaResize,
		Workloads:    DefaultWorkloads(),
		ProfileModes: map[string]AttachMode{},
		Projects:     map[string]ProjectSpec{},
	}
	if root == nil {
		return s
	}
	w.mapping(root, "policy", topKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "version":
			if n, ok := w.integer(v, "version", 1, 1); ok && n != 1 {
				w.errf(v, "version %d not supported", n)
			}
		case "defaults":
			w.mapping(v, "defaults", []string{"attach_mode", "load_cooldown", "quota"}, func(key string, k, v *yaml.Node) {
				switch key {
				case "attach_mode":
					s.AttachMode = w.mode(v)
				case "load_cooldown":
					s.LoadCooldown = w.duration(v, key)
				case "quota":
					s.Quota = w.quota(v, cat)
				}
			})
		case "workloads":
			w.mapping(v, "workloads", nil, func(name string, k, v *yaml.Node) {
				w.checkIdent(k, "workload")
				s.Workloads[name] = w.preference(v, cat)
			})
		case "profiles":
			w.mapping(v, "profiles", nil, func(name string, k, v *yaml.Node) {
				canon := w.profileName(k, cat)
				w.mapping(v, "profile "+name, []string{"attach_mode"}, func(key string, k, v *yaml.Node) {
					s.ProfileModes[canon] = w.mode(v)
				})
			})
		case "projects":
			w.mapping(v, "projects", nil, func(id string, k, v *yaml.Node) {
				s.Projects[id] = w.project(id, v, cat)
			})
		case "rules":
			if isNull(v) {
				return
			}
			if v.Kind != yaml.SequenceNode {
				w.errf(v, "rules must be a list")
				return
			}
			seen := map[string]*yaml.Node{}
			for _, it := range v.Content {
				r := w.rule(it)
				if r.Name == "" {
					continue
				}
				if prev, dup := seen[r.Name]; dup {
					w.errf(r.node, "rule %q already defined at %d:%d", r.Name, prev.Line, prev.Column)
					continue
				}
				seen[r.Name] = r.node
				s.Rules = append(s.Rules, r)
			}
		}
	})
	return s
}

func (w *walker) checkIdent(n *yaml.Node, what string) {
	for _, r := range n.Value {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			w.errf(n, "%s name %q: want lower-case letters, digits, '-' and '_'", what, n.Value)
			return
		}
	}
}

func (w *walker) mode(n *yaml.Node) AttachMode {
	s, ok := w.scalar(n, "attach_mode")
	if !ok {
		return ""
	}
	m, ok := parseMode(s)
	if !ok {
		w.errf(n, "attach_mode %q: want nova-resize, direct-live or direct-cold", s)
	}
	return m
}

// profileName checks a profile name against the catalog and returns its
// canonical form.
func (w *walker) profileName(n *yaml.Node, cat *catalog.Catalog) string {
	if n.Kind != yaml.ScalarNode {
		w.errf(n, "profile name must be a string")
		return ""
	}
	pn, err := catalog.ParseName(n.Value)
	if err != nil {
		w.errf(n, "%v", err)
		return n.Value
	}
	if cat != nil {
		if _, ok := cat.ByName(pn.Name); !ok {
			w.errf(n, "profile %s is not in the profile catalog", pn.Name)
		}
	}
	return pn.Name
}

func (w *walker) seriesList(n *yaml.Node, what string) []catalog.Series {
	list, nodes := w.strList(n, what)
	out := []catalog.Series{}
	for i, s := range list {
		se := catalog.Series(strings.ToUpper(s))
		if !se.Valid() {
			w.errf(nodes[i], "series %q: want Q, C, B or A", s)
			continue
		}
		out = append(out, se)
	}
	return out
}

func (w *walker) profileList(n *yaml.Node, what string, cat *catalog.Catalog) []string {
	_, nodes := w.strList(n, what)
	out := []string{}
	for _, pn := range nodes {
		out = append(out, w.profileName(pn, cat))
	}
	return out
}

func (w *walker) quota(n *yaml.Node, cat *catalog.Catalog) Quota {
	var q Quota
	w.mapping(n, "quota", []string{"max_vgpus", "max_framebuffer_gib", "max_vgpus_per_vm", "allowed_series", "allowed_profiles"}, func(key string, k, v *yaml.Node) {
		switch key {
		case "max_vgpus", "max_framebuffer_gib", "max_vgpus_per_vm":
			x, ok := w.integer(v, key, 0, 1<<20)
			if !ok {
				return
			}
			switch key {
			case "max_vgpus":
				q.MaxVGPUs = &x
			case "max_framebuffer_gib":
				q.MaxFramebufferGiB = &x
			default:
				q.MaxVGPUsPerVM = &x
			}
		case "allowed_series":
			q.AllowedSeries = w.seriesList(v, key)
		case "allowed_profiles":
			q.AllowedProfiles = w.profileList(v, key, cat)
		}
	})
	return q
}

func (w *walker) preference(n *yaml.Node, cat *catalog.Catalog) Preference {
	p := Preference{Choose: ChooseSmallest}
	w.mapping(n, "workload", []string{"series", "choose", "profiles", "min_framebuffer_gib", "max_framebuffer_gib", "frame_rate_limit"}, func(key string, k, v *yaml.Node) {
		switch key {
		case "series":
			p.Series = w.seriesList(v, key)
		case "choose":
			switch c := Choose(w.str(v, key)); c {
			case ChooseLargest, ChooseSmallest:
				p.Choose = c
			default:
				w.errf(v, "choose %q: want largest or smallest", c)
			}
		case "profiles":
			p.Profiles = w.profileList(v, key, cat)
		case "min_framebuffer_gib":
			p.MinFramebufferGiB, _ = w.integer(v, key, 0, 1<<16)
		case "max_framebuffer_gib":
			p.MaxFramebufferGiB, _ = w.integer(v, key, 0, 1<<16)
		case "frame_rate_limit":
			on := w.boolean(v, key)
			p.FrameRateLimit = &on
		}
	})
	if p.MaxFramebufferGiB > 0 && p.MinFramebufferGiB > p.MaxFramebufferGiB {
		w.errf(n, "min_framebuffer_gib %d is above max_framebuffer_gib %d", p.MinFramebufferGiB, p.MaxFramebufferGiB)
	}
	return p
}

func (w *walker) project(id string, n *yaml.Node, cat *catalog.Catalog) ProjectSpec {
	ps := ProjectSpec{}
	w.mapping(n, "project "+id, []string{"attach_mode", "quota", "workloads", "profiles"}, func(key string, k, v *yaml.Node) {
		switch key {
		case "attach_mode":
			ps.AttachMode = w.mode(v)
		case "quota":
			ps.Quota = w.quota(v, cat)
		case "workloads":
			ps.Workloads = map[string]Preference{}
			w.mapping(v, "workloads", nil, func(name string, k, v *yaml.Node) {
				w.checkIdent(k, "workload")
				ps.Workloads[name] = w.preference(v, cat)
			})
		case "profiles":
			ps.Profiles = map[string]AttachMode{}
			w.mapping(v, "profiles", nil, func(name string, k, v *yaml.Node) {
				canon := w.profileName(k, cat)
				w.mapping(v, "profile "+name, []string{"attach_mode"}, func(key string, k, v *yaml.Node) {
					ps.Profiles[canon] = w.mode(v)
				})
			})
		}
	})
	return ps
}

var ruleKeys = []string{"name", "description", "on", "when", "then", "for", "cooldown", "final"}

func (w *walker) rule(n *yaml.Node) ruleSpec {
	r := ruleSpec{node: n}
	if n.Kind != yaml.MappingNode {
		w.errf(n, "a rule must be a mapping with name, on, when, then")
		return r
	}
	var nameNode *yaml.Node
	w.mapping(n, "rule", ruleKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "name":
			r.Name = w.str(v, key)
			nameNode = v
		case "description":
			r.Description = w.str(v, key)
		case "on":
			var nodes []*yaml.Node
			r.On, nodes = w.strList(v, key)
			for i, kind := range r.On {
				if kind == "" || strings.ContainsAny(kind, " \t") || strings.Contains(strings.TrimSuffix(kind, "*"), "*") {
					w.errf(nodes[i], "event kind %q: want e.g. webhook.GPU_LOAD, alert, nova.instance.resize* (one trailing * allowed)", kind)
				}
			}
		case "when":
			r.When, _ = w.scalar(v, key)
			r.whenNode = v
		case "then":
			r.Then, r.thenNodes = w.strList(v, key)
		case "for":
			r.For = w.duration(v, key)
		case "cooldown":
			r.Cooldown = w.duration(v, key)
			r.cooldownSet = true
		case "final":
			r.Final = w.boolean(v, key)
		}
	})
	if nameNode == nil {
		w.errf(n, "rule without a name")
		return ruleSpec{}
	}
	if r.Name == "" {
		return ruleSpec{}
	}
	rw := func(at *yaml.Node, format string, a ...any) {
		w.errs = append(w.errs, Error{Line: at.Line, Col: at.Column, Rule: r.Name, Msg: fmt.Sprintf(format, a...)})
	}
	if len(r.On) == 0 {
		rw(n, "needs \"on\": the event kinds it listens to")
	}
	if len(r.Then) == 0 {
		rw(n, "needs \"then\": one or more intents such as attach(preferred, 1)")
	}
	if r.When == "" {
		r.When = "true"
	}
	return r
}

func ptr[T any](v T) *T { return &v }
