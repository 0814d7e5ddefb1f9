// Package unifiedlimits reads a project's vGPU limits from Keystone's
// unified limits, the numbers Nova enforces on flavors with
// [quota] driver = nova.quota.UnifiedLimitsDriver, and the project's usage
// as Nova counts it, from Placement.
//
// Nova's way (nova/limit/placement.py and oslo_limit/limit.py, Nova 26):
//
//   - The limit of a resource class RC is the unified limit named
//     "class:RC" (nova.limit.placement._get_deltas_by_flavor names a
//     flavor's resources so), registered under the service and region of
//     Nova's [oslo_limit] endpoint_id (oslo_limit.limit._EnforcerUtils.__init__
//     reads the endpoint and keeps its service_id and region_id).
//   - A project limit of that service, region and resource overrides the
//     registered limit (oslo_limit.limit._EnforcerUtils._get_limit);
//     with neither, the limit is 0: nothing is allowed
//     (_EnforcerUtils.get_project_limits, _LimitNotFound).
//   - The usage of "class:RC" is Placement's usage of RC for the project,
//     GET /usages?project_id= (nova.limit.placement._get_usage,
//     _get_placement_usages); a class Placement does not report is 0.
//   - A request is refused when usage + delta > limit
//     (oslo_limit.limit._EnforcerUtils.enforce_limits).
//
// The bridge reads the same "class:VGPU" limit, so one number governs a
// tenant's own resize to a vGPU flavor through Nova and the bridge's
// direct-path attaches (whose claims live in the instance's consumer in
// Placement, so Nova counts them too).
//
// Per-profile limits are the bridge's own: Nova 26 has no resource per
// vGPU type. They are unified limits named "vgpu:<profile>" (the
// profile catalog's name, e.g. "vgpu:T4-4Q"), registered under the
// bridge's own service (the service and region of [quota]
// profile_endpoint_id). A profile without such a limit is not limited by
// profile; "class:VGPU" still counts it.
package unifiedlimits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/registeredlimits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// ResourceVGPU is the unified limit Nova enforces on a flavor's
// resources:VGPU (nova.limit.placement._get_deltas_by_flavor).
const ResourceVGPU = "class:VGPU"

// ProfilePrefix names the bridge's per-profile limits: "vgpu:" + profile.
const ProfilePrefix = "vgpu:"

// Limit is one unified limit of a project.
type Limit struct {
	// Resource is the unified limit's resource name: "class:VGPU" or
	// "vgpu:<profile>".
	Resource string `json:"resource"`
	// Profile is the profile a "vgpu:" limit counts; "" for class:VGPU.
	Profile string `json:"profile,omitempty"`
	// Limit is the number of vGPUs allowed.
	Limit int `json:"limit"`
	// Origin says where Limit comes from: "project" (a project limit),
	// "registered" (the service's registered limit) or "none" (class:VGPU
	// without either: 0, as oslo_limit takes it).
	Origin string `json:"origin"`
}

// Identity hands out a logged-in Keystone identity v3 client.
type Identity interface {
	IdentityClient(ctx context.Context) (*gophercloud.ServiceClient, error)
}

// Usages reads a project's Placement usage by resource class, every
// consumer together (GET /usages?project_id= at microversion 1.9, as
// Nova: placement.Client.ProjectClassUsages).
type Usages interface {
	ProjectClassUsages(ctx context.Context, project string) (map[string]int, error)
}

// Config says whose limits the source reads.
type Config struct {
	// ComputeEndpointID is Nova's [oslo_limit] endpoint_id: class:VGPU is
	// read from the registered and project limits of its service and
	// region.
	ComputeEndpointID string
	// ProfileEndpointID is the bridge's own endpoint: "vgpu:<profile>"
	// limits are read from its service and region; empty: no per-profile
	// limits.
	ProfileEndpointID string
	// TTL is how long limits read from Keystone are used before they are
	// read again; default 30s.
	TTL time.Duration
	// Refresh, when positive, is how often Run reads again, in the
	// background, the limits of the projects asked for within Idle, so a
	// decision finds them read (while Refresh < TTL) instead of waiting
	// for Keystone. 0: limits are read again only when a decision finds
	// them older than TTL.
	Refresh time.Duration
	// Idle is how long a project nobody asked for keeps being refreshed;
	// default 1h. After it, its limits are read when next asked for.
	Idle time.Duration
	// Log receives the background reads' failures; nil discards them.
	Log *slog.Logger
}

// ErrUnavailable wraps every failure to read limits or usage: the
// decision waits and is tried again, never taken as unlimited.
var ErrUnavailable = errors.New("unified limits unavailable")

// Source reads limits (cached for Config.TTL) and usage (never cached).
// It is safe for concurrent use.
type Source struct {
	cfg      Config
	identity Identity
	usages   Usages
	now      func() time.Time

	mu        sync.Mutex
	system    bool             // the bridge's token was seen system-scoped
	scopes    map[string]scope // endpoint id → its service and region
	projects  map[string]cached
	registers map[string]cachedRegistered // endpoint id →
}

type scope struct{ service, region string }

type cached struct {
	at     time.Time // read from Keystone
	used   time.Time // last asked for (Limits)
	limits []Limit
}

type cachedRegistered struct {
	at     time.Time
	limits map[string]int
}

// New returns a source; it calls nothing until asked.
func New(cfg Config, identity Identity, usages Usages) (*Source, error) {
	if cfg.ComputeEndpointID == "" {
		return nil, errors.New("unified limits: no compute endpoint id (Nova's [oslo_limit] endpoint_id)")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 30 * time.Second
	}
	if cfg.Idle <= 0 {
		cfg.Idle = time.Hour
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Source{cfg: cfg, identity: identity, usages: usages, now: time.Now,
		scopes: map[string]scope{}, projects: map[string]cached{}, registers: map[string]cachedRegistered{}}, nil
}

// Limits returns the project's class:VGPU limit, then its vgpu:<profile>
// limits sorted by profile.
func (s *Source) Limits(ctx context.Context, project string) ([]Limit, error) {
	now := s.now()
	s.mu.Lock()
	c, ok := s.projects[project]
	if ok {
		c.used = now
		s.projects[project] = c
	}
	s.mu.Unlock()
	if ok && now.Sub(c.at) < s.cfg.TTL {
		return c.limits, nil
	}
	out, err := s.read(ctx, project)
	if err != nil {
		return nil, fmt.Errorf("%w: project %s: %w", ErrUnavailable, project, err)
	}
	s.store(project, out, now)
	return out, nil
}

// store caches limits read of project; used is when it was last asked
// for (zero: keep what the cache has).
func (s *Source) store(project string, limits []Limit, used time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if used.IsZero() {
		c, ok := s.projects[project]
		if !ok {
			return // forgotten meanwhile
		}
		used = c.used
	}
	s.projects[project] = cached{at: s.now(), used: used, limits: limits}
}

// Run reads the limits again every Config.Refresh until ctx ends (at
// once when Refresh is 0: nothing to do): those of each project asked for
// within Config.Idle, the registered limits once per round; a project
// idle longer is forgotten. A failed read keeps what was read before,
// used until it is older than the TTL, as without Run; it is logged.
func (s *Source) Run(ctx context.Context) error {
	if s.cfg.Refresh <= 0 {
		return nil
	}
	wake.Every(ctx, s.cfg.Refresh, func(ctx context.Context) {
		if err := s.Refresh(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("unified limits: background read failed; the limits read before are used until they are older than [quota] cache_ttl",
				logkey.Err, err)
		}
	})
	return nil
}

// Refresh is one round of Run.
func (s *Source) Refresh(ctx context.Context) error {
	now := s.now()
	var projects []string
	s.mu.Lock()
	for p, c := range s.projects {
		if now.Sub(c.used) > s.cfg.Idle {
			delete(s.projects, p)
			continue
		}
		projects = append(projects, p)
	}
	s.registers = map[string]cachedRegistered{} // read once for the round
	s.mu.Unlock()
	sort.Strings(projects)
	var errs []error
	for _, p := range projects {
		out, err := s.read(ctx, p)
		if err != nil {
			errs = append(errs, fmt.Errorf("project %s: %w", p, err))
			continue
		}
		s.store(p, out, time.Time{})
	}
	return errors.Join(errs...)
}

func (s *Source) read(ctx context.Context, project string) ([]Limit, error) {
	sc, err := s.identity.IdentityClient(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.checkSystemScope(ctx, sc); err != nil {
		return nil, err
	}
	compute, err := s.effective(ctx, sc, s.cfg.ComputeEndpointID, project, func(r string) bool { return r == ResourceVGPU })
	if err != nil {
		return nil, err
	}
	vgpu := Limit{Resource: ResourceVGPU, Origin: "none"} // oslo_limit: no limit found is 0
	if l, ok := compute[ResourceVGPU]; ok {
		vgpu = l
	}
	out := []Limit{vgpu}
	if s.cfg.ProfileEndpointID == "" {
		return out, nil
	}
	profiles, err := s.effective(ctx, sc, s.cfg.ProfileEndpointID, project, func(r string) bool {
		return strings.HasPrefix(r, ProfilePrefix) && len(r) > len(ProfilePrefix)
	})
	if err != nil {
		return nil, err
	}
	for _, l := range profiles {
		l.Profile = strings.TrimPrefix(l.Resource, ProfilePrefix)
		out = append(out, l)
	}
	sort.Slice(out[1:], func(i, j int) bool { return out[1+i].Profile < out[1+j].Profile })
	return out, nil
}

// effective is, for each resource keep accepts, the project's limit of
// the endpoint's service and region, else the registered one
// (oslo_limit.limit._EnforcerUtils._get_limit).
func (s *Source) effective(ctx context.Context, sc *gophercloud.ServiceClient, endpoint, project string, keep func(string) bool) (map[string]Limit, error) {
	sp, err := s.scope(ctx, sc, endpoint)
	if err != nil {
		return nil, err
	}
	reg, err := s.registered(ctx, sc, endpoint, sp)
	if err != nil {
		return nil, err
	}
	out := map[string]Limit{}
	for r, n := range reg {
		if keep(r) {
			out[r] = Limit{Resource: r, Limit: n, Origin: "registered"}
		}
	}
	// GET /v3/limits?project_id=&service_id=&region_id= (oslo_limit.limit._EnforcerUtils._get_project_limit)
	pages, err := limits.List(sc, limits.ListOpts{ProjectID: project, ServiceID: sp.service, RegionID: sp.region}).AllPages(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /v3/limits?project_id=%s: %w", project, err)
	}
	ls, err := limits.ExtractLimits(pages)
	if err != nil {
		return nil, fmt.Errorf("GET /v3/limits?project_id=%s: %w", project, err)
	}
	for _, l := range ls {
		// Keystone filters; a limit of another scope (an older Keystone
		// ignoring a filter) is not the project's.
		if l.ProjectID != project || l.ServiceID != sp.service || sp.region != "" && l.RegionID != sp.region || !keep(l.ResourceName) {
			continue
		}
		out[l.ResourceName] = Limit{Resource: l.ResourceName, Limit: l.ResourceLimit, Origin: "project"}
	}
	return out, nil
}

// checkSystemScope makes sure the bridge's token is system-scoped, as
// oslo_limit's ([oslo_limit] system_scope = all): Keystone answers a
// project-scoped token's GET /v3/limits with that project's limits only
// (keystone.api.limits.LimitsResource._list_limits), so every other
// project would silently get the registered limit.
func (s *Source) checkSystemScope(ctx context.Context, sc *gophercloud.ServiceClient) error {
	s.mu.Lock()
	ok := s.system
	s.mu.Unlock()
	if ok {
		return nil
	}
	var tok struct {
		System map[string]any `json:"system"`
	}
	if err := tokens.Get(ctx, sc, sc.Token()).ExtractInto(&tok); err != nil { // the body's "token"
		return fmt.Errorf("GET /v3/auth/tokens (the bridge's own): %w", err)
	}
	if tok.System == nil {
		return errors.New("the bridge's Keystone token is not system-scoped: Keystone shows a project-scoped token " +
			"its own project's limits only; give the bridge's credentials system_scope: all (clouds.yaml) and the reader role on the system")
	}
	s.mu.Lock()
	s.system = true
	s.mu.Unlock()
	return nil
}

// registered returns the registered limits of the endpoint's service and
// region, cached for the TTL (oslo_limit.limit._EnforcerUtils._get_registered_limit).
func (s *Source) registered(ctx context.Context, sc *gophercloud.ServiceClient, endpoint string, sp scope) (map[string]int, error) {
	s.mu.Lock()
	c, ok := s.registers[endpoint]
	s.mu.Unlock()
	if ok && s.now().Sub(c.at) < s.cfg.TTL {
		return c.limits, nil
	}
	pages, err := registeredlimits.List(sc, registeredlimits.ListOpts{ServiceID: sp.service, RegionID: sp.region}).AllPages(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /v3/registered_limits?service_id=%s&region_id=%s: %w", sp.service, sp.region, err)
	}
	rls, err := registeredlimits.ExtractRegisteredLimits(pages)
	if err != nil {
		return nil, fmt.Errorf("GET /v3/registered_limits?service_id=%s: %w", sp.service, err)
	}
	m := map[string]int{}
	for _, r := range rls {
		if r.ServiceID == sp.service && (sp.region == "" || r.RegionID == sp.region) {
			m[r.ResourceName] = r.DefaultLimit
		}
	}
	s.mu.Lock()
	s.registers[endpoint] = cachedRegistered{at: s.now(), limits: m}
	s.mu.Unlock()
	return m, nil
}

// scope reads an endpoint's service and region once (they do not change
// for an endpoint id).
func (s *Source) scope(ctx context.Context, sc *gophercloud.ServiceClient, endpoint string) (scope, error) {
	s.mu.Lock()
	sp, ok := s.scopes[endpoint]
	s.mu.Unlock()
	if ok {
		return sp, nil
	}
	ep, err := endpoints.Get(ctx, sc, endpoint).Extract()
	if err != nil {
		return scope{}, fmt.Errorf("GET /v3/endpoints/%s: %w", endpoint, err)
	}
	sp = scope{service: ep.ServiceID, region: ep.RegionID}
	if sp.region == "" {
		sp.region = ep.Region
	}
	s.mu.Lock()
	s.scopes[endpoint] = sp
	s.mu.Unlock()
	return sp, nil
}

// PlacementVGPUs is the project's VGPU usage as Nova counts it for
// class:VGPU: Placement's usage of the project
// (nova.limit.placement._get_usage), every consumer type together; 0 when
// Placement reports none.
func (s *Source) PlacementVGPUs(ctx context.Context, project string) (int, error) {
	u, err := s.usages.ProjectClassUsages(ctx, project)
	if err != nil {
		return 0, fmt.Errorf("%w: Placement usages of project %s: %w", ErrUnavailable, project, err)
	}
	return u["VGPU"], nil
}
