package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// Options are what a policy is compiled against.
type Options struct {
	// Catalog of vGPU profiles; profile names in the file are checked
	// against it. Nil: an empty catalog.
	Catalog *catalog.Catalog
	// Compat is the driver compatibility matrix. Nil: no driver checks.
	Compat *Compat
	// Clock gives the time of events without one. Nil: time.Now.
	Clock func() time.Time
}

// Policy is a compiled policy file. It is immutable and safe for concurrent
// use.
type Policy struct {
	spec   *spec
	cat    *catalog.Catalog
	compat *Compat
	clock  func() time.Time
	rules  []*rule
	exact  map[string][]*rule
	wild   []*rule
	byKind sync.Map // kind → []*rule, file order
	hash   string

	profMu   sync.Mutex
	profiles atomic.Pointer[profileSnap]
}

type profileSnap struct {
	version uint64
	list    []catalog.Profile
	steps   map[string][2]string // name → {smaller, larger}
}

// LoadFile reads and compiles a policy file.
func LoadFile(path string, opt Options) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	defer f.Close()
	p, err := Load(f, opt)
	var le *LoadError
	if errors.As(err, &le) {
		le.File = path
	}
	return p, err
}

// Load reads and compiles a policy document. Every problem is reported,
// with line and column, in a *LoadError.
func Load(r io.Reader, opt Options) (*Policy, error) {
	root, src, err := readDoc(r)
	if err != nil {
		var le *LoadError
		if errors.As(err, &le) {
			return nil, le
		}
		return nil, fmt.Errorf("load policy: %w", err)
	}
	cat := opt.Catalog
	if cat == nil {
		cat = catalog.New()
	}
	w := &walker{}
	s := w.parseSpec(root, cat)
	p := &Policy{cat: cat}
	env, err := newEnv(p.step)
	if err != nil {
		return nil, fmt.Errorf("policy: CEL environment: %w", err)
	}
	rules := w.compileRules(env, src, s.Rules, s.LoadCooldown)
	if len(w.errs) > 0 {
		sort.SliceStable(w.errs, func(i, j int) bool {
			a, b := w.errs[i], w.errs[j]
			if a.Line != b.Line {
				return a.Line < b.Line
			}
			return a.Col < b.Col
		})
		return nil, &LoadError{Errors: w.errs}
	}
	sum := sha256.Sum256(src)
	p.spec, p.compat, p.clock, p.rules = s, opt.Compat, opt.Clock, rules
	p.exact = map[string][]*rule{}
	p.hash = hex.EncodeToString(sum[:8])
	if p.clock == nil {
		p.clock = time.Now
	}
	for _, r := range rules {
		isWild := false
		for _, k := range r.On {
			if strings.HasSuffix(k, "*") {
				isWild = true
			} else {
				p.exact[k] = append(p.exact[k], r)
			}
		}
		if isWild {
			p.wild = append(p.wild, r)
		}
	}
	return p, nil
}

// Hash identifies the policy file's content (hex of the first 8 bytes of
// its SHA-256).
func (p *Policy) Hash() string { return p.hash }

// Rules returns the rule names in file order.
func (p *Policy) Rules() []string {
	out := make([]string, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.Name
	}
	return out
}

// Catalog returns the profile catalog the policy was compiled against.
func (p *Policy) Catalog() *catalog.Catalog { return p.cat }

// Compat returns the driver compatibility matrix, nil if none.
func (p *Policy) Compat() *Compat { return p.compat }

// rulesFor returns the rules that listen to an event kind, in file order.
func (p *Policy) rulesFor(kind string) []*rule {
	if v, ok := p.byKind.Load(kind); ok {
		return v.([]*rule)
	}
	var out []*rule
	for _, r := range p.rules {
		if r.listens(kind) {
			out = append(out, r)
		}
	}
	if len(p.exact)+len(p.wild) > 0 && len(kind) <= 200 {
		p.byKind.Store(kind, out)
	}
	return out
}

// Listens reports whether a rule of the policy is on events of kind: an
// event no rule listens to decides nothing (its decision lists no rule).
func (p *Policy) Listens(kind string) bool { return len(p.rulesFor(kind)) > 0 }

func (r *rule) listens(kind string) bool {
	for _, k := range r.On {
		if k == kind || strings.HasSuffix(k, "*") && strings.HasPrefix(kind, strings.TrimSuffix(k, "*")) {
			return true
		}
	}
	return false
}

// profileList is the catalog's profiles, cached per catalog version.
func (p *Policy) profileList() []catalog.Profile {
	v := p.cat.Version()
	if s := p.profiles.Load(); s != nil && s.version == v {
		return s.list
	}
	p.profMu.Lock()
	defer p.profMu.Unlock()
	s := &profileSnap{version: v, list: p.cat.Profiles()}
	s.steps = neighbours(s.list)
	p.profiles.Store(s)
	return s.list
}

// step returns the next smaller (dir < 0) or larger profile; "" if none.
func (p *Policy) step(name string, dir int) string {
	p.profileList()
	s := p.profiles.Load()
	n, ok := s.steps[name]
	if !ok {
		pn, err := catalog.ParseName(name)
		if err != nil {
			return ""
		}
		n = s.steps[pn.Name]
	}
	if dir < 0 {
		return n[0]
	}
	return n[1]
}

// ProjectQuota returns the effective quota of a project: the policy
// file's defaults with the project's own on top.
func (p *Policy) ProjectQuota(id string) Quota { return p.projectQuota(id) }

// projectQuota returns the effective quota of a project.
func (p *Policy) projectQuota(id string) Quota {
	q := p.spec.Quota
	if ps, ok := p.spec.Projects[id]; ok {
		q = q.over(ps.Quota)
	}
	return q
}

// attachMode resolves the attach mode, most specific first: the project's
// setting for the profile, the project's, the profile's, the default.
func (p *Policy) attachMode(project, profile string) (AttachMode, string) {
	ps, ok := p.spec.Projects[project]
	if ok {
		if m, ok := ps.Profiles[profile]; ok && m != "" {
			return m, fmt.Sprintf("project %s sets %s for %s", project, m, profile)
		}
		if ps.AttachMode != "" {
			return ps.AttachMode, fmt.Sprintf("project %s sets %s", project, ps.AttachMode)
		}
	}
	if m, ok := p.spec.ProfileModes[profile]; ok && m != "" {
		return m, fmt.Sprintf("profile %s sets %s", profile, m)
	}
	return p.spec.AttachMode, "default " + string(p.spec.AttachMode)
}

// workload returns the preference for a workload in a project.
func (p *Policy) workload(project, name string) (Preference, bool) {
	if ps, ok := p.spec.Projects[project]; ok {
		if pr, ok := ps.Workloads[name]; ok {
			return pr, true
		}
	}
	pr, ok := p.spec.Workloads[name]
	return pr, ok
}
