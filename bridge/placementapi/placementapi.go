// Package placementapi serves the placement part of the operator API:
// POST /v1/placements/dry-run, POST /v1/placements/sync, GET /v1/gpus,
// GET /v1/hosts, GET /v1/hosts/{name} and GET /v1/allocations, all read
// from the mirror and its in-memory index (the mixed bridge-owned GPUs,
// which the index never holds, from Placement and the agents' reports:
// placement.Service.MixedGPUs); and POST
// /v1/hosts/{name}/gpus/{pci}/retype, which re-types an empty
// bridge-owned GPU (retype.go).
package placementapi

import (
	"context"
	_ "embed"
	"errors"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

//go:embed openapi.json
var openAPI []byte

// Handlers serve the routes over a placement service.
type Handlers struct {
	svc *placement.Service
	// Marks, when set, adds drains and Nova's disabled services to the
	// hosts and GPUs answered (bridge/controls).
	Marks Marks
}

// HostMark is what operators and Nova say of a host.
type HostMark struct {
	Drained        bool
	DrainReason    string
	Disabled       bool // Nova's compute service disabled or forced down
	DisabledReason string
}

// GPUMark is what operators say of a GPU.
type GPUMark struct {
	Drained     bool
	DrainReason string
}

// Marks gives the marked hosts (by compute service host and by node name)
// and GPUs (by provider UUID).
type Marks interface {
	Marks(ctx context.Context) (map[string]HostMark, map[string]GPUMark, error)
}

// marks reads the marks; empty maps when none are configured.
func (h *Handlers) marks(c echo.Context) (map[string]HostMark, map[string]GPUMark, error) {
	if h.Marks == nil {
		return nil, nil, nil
	}
	return h.Marks.Marks(c.Request().Context())
}

// New returns the handlers of svc.
func New(svc *placement.Service) *Handlers { return &Handlers{svc: svc} }

// Register adds the routes and their OpenAPI description to srv.
func (h *Handlers) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/placements/dry-run", api.Fleet, h.dryRun)
	srv.Handle(http.MethodPost, "/v1/placements/sync", api.Admin, h.sync)
	srv.Handle(http.MethodGet, "/v1/gpus", api.Fleet, h.gpus)
	srv.Handle(http.MethodGet, "/v1/hosts", api.Fleet, h.hosts)
	srv.Handle(http.MethodGet, "/v1/hosts/:name", api.Fleet, h.host)
	srv.Handle(http.MethodGet, "/v1/allocations", api.Project, h.allocations)
	srv.Handle(http.MethodPost, "/v1/hosts/:name/gpus/:pci/retype", api.Admin, h.retype)
	srv.Describe(openAPI)
}

func (h *Handlers) dryRun(c echo.Context) error {
	var req placement.DryRunRequest
	if err := api.DecodeJSON(c, &req); err != nil {
		return err
	}
	var bad []api.InvalidParam
	if req.Profile == "" && len(req.Traits.Required) == 0 {
		bad = append(bad, api.InvalidParam{Name: "profile", Reason: "give a profile or traits.required"})
	}
	if req.Count < 0 {
		bad = append(bad, api.InvalidParam{Name: "count", Reason: "must be 1 or more"})
	}
	if req.Limit < 0 || req.Limit > engine.MaxLimit {
		bad = append(bad, api.InvalidParam{Name: "limit", Reason: "must be within 1..1000"})
	}
	if req.Strategy != "" && req.Strategy != string(engine.Pack) && req.Strategy != string(engine.Spread) {
		bad = append(bad, api.InvalidParam{Name: "strategy", Reason: "must be pack or spread"})
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	out, err := h.svc.DryRun(req)
	switch {
	case errors.Is(err, placement.ErrUnknownProfile):
		return api.ValidationProblem([]api.InvalidParam{{Name: "profile", Reason: err.Error()}})
	case errors.Is(err, engine.ErrInvalidRequest):
		return api.ValidationProblem([]api.InvalidParam{{Name: "traits", Reason: err.Error()}})
	case err != nil:
		return err
	}
	if err := h.svc.MixedDryRun(c.Request().Context(), req, &out); err != nil {
		return err
	}
	h.svc.ExplainRetypes(c.Request().Context(), &out)
	return c.JSON(http.StatusOK, out)
}

func (h *Handlers) sync(c echo.Context) error {
	full := c.QueryParam("full") == "true"
	ctx, cancel := context.WithTimeout(c.Request().Context(), 10*time.Minute)
	defer cancel()
	st, err := h.svc.SyncNow(ctx, full, nil)
	if errors.Is(err, placement.ErrSyncBusy) {
		p := api.Problem(http.StatusConflict, "Sync running", err.Error())
		p.Headers = map[string]string{"Retry-After": "10"}
		return p
	}
	if err != nil {
		return api.Problem(http.StatusBadGateway, "Placement sync failed", err.Error())
	}
	return c.JSON(http.StatusOK, map[string]any{
		"full": st.Full, "providers": st.Providers, "fetched": st.Fetched, "removed": st.Removed,
		"gpus": st.GPUs, "duration_seconds": st.Duration.Seconds(),
	})
}

// GPU is one physical GPU in answers.
type GPU struct {
	ProviderUUID  string   `json:"provider_uuid"`
	Name          string   `json:"name"`
	Host          string   `json:"host"`
	Node          string   `json:"node"`
	RootUUID      string   `json:"root_provider_uuid"`
	PCIAddress    string   `json:"pci_address,omitempty"`
	ResourceClass string   `json:"resource_class"`
	Trait         string   `json:"trait,omitempty"`
	Profile       string   `json:"profile,omitempty"`
	Total         int      `json:"total"`
	Reserved      int      `json:"reserved"`
	Capacity      int      `json:"capacity"`
	Used          int      `json:"used"`
	Free          int      `json:"free"`
	Generation    int      `json:"generation"`
	Traits        []string `json:"traits"`
	Drained       bool     `json:"drained"`
	DrainReason   string   `json:"drain_reason,omitempty"`
	// Undeclared: a bridge-owned GPU no longer in [placement]
	// bridge_owned_gpus, kept (reserved whole) while a vGPU is
	// allocated on it (placement.Service.RetireOwned).
	Undeclared bool `json:"undeclared,omitempty"`
	// Owner is "bridge" for a bridge-owned GPU ([placement]
	// bridge_owned_gpus), "nova" for the GPUs Nova manages.
	Owner string `json:"owner"`
	// Mode is "single" (one vGPU type at a time: Total and the other
	// amounts count vGPUs) or "mixed" (a bridge-owned GPU declared
	// HOST/PF=mixed: vGPUs of several types side by side, framebuffer
	// being the limit; the amounts are MiB of resource_class
	// CUSTOM_VGPU_BRIDGE_FB_MIB, and Framebuffer, TypesInUse and Health
	// tell the rest).
	Mode string `json:"mode"`
	// Framebuffer is a mixed GPU's framebuffer in MiB.
	Framebuffer *Framebuffer `json:"framebuffer,omitempty"`
	// TypesInUse are a mixed GPU's vGPUs by type (its agent's last
	// report).
	TypesInUse []TypeInUse `json:"types_in_use,omitempty"`
	// Health is a mixed GPU's health as its agent last reported it (ok,
	// degraded, failed, unknown; "" when the report lacks the GPU).
	Health string `json:"health,omitempty"`
	// Problem says what of a mixed GPU could not be read (its provider
	// not published yet, Placement unreachable, no report): the row then
	// holds what its agent's report says.
	Problem string `json:"problem,omitempty"`
}

// Modes of GPU.Mode and owners of GPU.Owner.
const (
	ModeSingle  = "single"
	ModeMixed   = "mixed"
	OwnerBridge = "bridge"
	OwnerNova   = "nova"
)

// Framebuffer is a mixed GPU's framebuffer: Total MiB offered (the GPU's
// less what Nova's VFs hold), Used of them claimed by vGPUs, Free left
// (Total less Reserved and Used).
type Framebuffer struct {
	TotalMiB int `json:"total_mib"`
	UsedMiB  int `json:"used_mib"`
	FreeMiB  int `json:"free_mib"`
}

// TypeInUse is how many vGPUs of one type a mixed GPU holds.
type TypeInUse struct {
	TypeID         string `json:"type_id"`
	Trait          string `json:"trait"`
	Profile        string `json:"profile,omitempty"`
	FramebufferMiB int    `json:"framebuffer_mib"`
	Count          int    `json:"count"`
}

func (h *Handlers) gpu(g *engine.GPU) GPU {
	out := GPU{
		ProviderUUID: g.UUID, Name: g.Name, Host: h.svc.HostName(g.Host.Name), Node: g.Host.Name, RootUUID: g.Host.RootUUID,
		PCIAddress: g.PCIAddress(), ResourceClass: g.Class, Total: g.Inventory.Total, Reserved: g.Inventory.Reserved,
		Capacity: g.Capacity(), Used: g.Used, Free: g.Free(), Generation: g.Generation, Traits: g.Traits,
		Undeclared: h.svc.IsUndeclaredOwned(g), Owner: OwnerNova, Mode: ModeSingle,
	}
	if g.Class == placement.BridgeClass {
		out.Owner = OwnerBridge
	}
	if out.Traits == nil {
		out.Traits = []string{}
	}
	if len(g.Types) > 0 {
		out.Trait = g.Types[0]
	} else if g.Class == placement.BridgeClass {
		// Its type trait (CUSTOM_1430) is not under type_trait_prefix.
		out.Trait = placement.OwnedTypeTrait(g.Traits)
	}
	if out.Trait != "" {
		out.Profile = h.svc.ProfileName(out.Trait)
	}
	return out
}

// mixed is a mixed bridge-owned GPU in answers: its amounts are MiB of
// placement.BridgeFBClass, its Trait and Profile empty (it offers every
// type of Traits).
func (h *Handlers) mixed(m placement.MixedGPU) GPU {
	out := GPU{
		ProviderUUID: m.Provider, Name: m.Name, Host: m.Host, Node: m.Node, RootUUID: m.RootUUID, PCIAddress: m.PCI,
		ResourceClass: placement.BridgeFBClass, Total: m.TotalMiB, Reserved: m.ReservedMiB, Capacity: m.TotalMiB - m.ReservedMiB,
		Used: m.UsedMiB, Free: max(m.TotalMiB-m.ReservedMiB-m.UsedMiB, 0), Generation: m.Generation, Traits: m.Traits,
		Owner: OwnerBridge, Mode: ModeMixed, Health: m.Health, Problem: m.Problem,
	}
	out.Framebuffer = &Framebuffer{TotalMiB: m.TotalMiB, UsedMiB: m.UsedMiB, FreeMiB: out.Free}
	for _, u := range m.InUse {
		out.TypesInUse = append(out.TypesInUse, TypeInUse{TypeID: u.TypeID, Trait: u.Trait, Profile: h.svc.ProfileName(u.Trait),
			FramebufferMiB: u.FramebufferMiB, Count: u.Count})
	}
	return out
}

// gpus answers the index's GPUs, then the mixed bridge-owned GPUs
// (placement.Service.MixedGPUs: read from Placement and the agents'
// reports, as the index never holds them).
func (h *Handlers) gpus(c echo.Context) error {
	host, trait, profile := c.QueryParam("host"), c.QueryParam("trait"), c.QueryParam("profile")
	_, gm, err := h.marks(c)
	if err != nil {
		return err
	}
	all := h.svc.Index().GPUs()
	out := make([]GPU, 0, len(all))
	for i := range all {
		g := h.gpu(&all[i])
		if m, ok := gm[g.ProviderUUID]; ok {
			g.Drained, g.DrainReason = m.Drained, m.DrainReason
		}
		if (host != "" && host != g.Host && host != g.Node) || (trait != "" && !all[i].HasTrait(trait)) || (profile != "" && profile != g.Profile) {
			continue
		}
		out = append(out, g)
	}
	mixed, err := h.svc.MixedGPUs(c.Request().Context())
	if err != nil {
		return err
	}
	for _, m := range mixed {
		g := h.mixed(m)
		if mk, ok := gm[g.ProviderUUID]; ok && g.ProviderUUID != "" {
			g.Drained, g.DrainReason = mk.Drained, mk.DrainReason
		}
		if (host != "" && host != g.Host && host != g.Node) || (trait != "" && !slices.Contains(g.Traits, trait)) ||
			(profile != "" && !slices.ContainsFunc(g.Traits, func(t string) bool { return h.svc.ProfileName(t) == profile })) {
			continue
		}
		out = append(out, g)
	}
	return c.JSON(http.StatusOK, map[string]any{"gpus": out})
}

// Host is one compute node in answers.
type Host struct {
	Name     string   `json:"name"`
	Node     string   `json:"node"`
	RootUUID string   `json:"root_provider_uuid"`
	Traits   []string `json:"traits"`
	// GPUs counts every GPU of the host, its mixed bridge-owned GPUs
	// (MixedGPUs of them) included; Capacity, Used and Free count the
	// vGPUs of the others (mode single), and Framebuffer sums the MiB of
	// the mixed ones (absent without any).
	GPUs        int          `json:"gpu_count"`
	MixedGPUs   int          `json:"mixed_gpu_count,omitempty"`
	Capacity    int          `json:"capacity"`
	Used        int          `json:"used"`
	Free        int          `json:"free"`
	Framebuffer *Framebuffer `json:"framebuffer,omitempty"`
	Detail      []GPU        `json:"gpus,omitempty"`
	// Drained by an operator, or Disabled by Nova: no new placements.
	Drained        bool   `json:"drained"`
	DrainReason    string `json:"drain_reason,omitempty"`
	Disabled       bool   `json:"disabled"`
	DisabledReason string `json:"disabled_reason,omitempty"`
}

func (h *Handlers) hostList(c echo.Context) (map[string]*Host, error) {
	hm, gm, err := h.marks(c)
	if err != nil {
		return nil, err
	}
	all := h.svc.Index().GPUs()
	hosts := map[string]*Host{}
	for i := range all {
		g := &all[i]
		x, ok := hosts[g.Host.Name]
		if !ok {
			x = &Host{Name: h.svc.HostName(g.Host.Name), Node: g.Host.Name, RootUUID: g.Host.RootUUID, Traits: g.Host.Traits}
			if x.Traits == nil {
				x.Traits = []string{}
			}
			m, ok := hm[x.Name]
			if !ok {
				m = hm[x.Node]
			}
			x.Drained, x.DrainReason, x.Disabled, x.DisabledReason = m.Drained, m.DrainReason, m.Disabled, m.DisabledReason
			hosts[g.Host.Name] = x
		}
		x.GPUs++
		x.Capacity += g.Capacity()
		x.Used += g.Used
		x.Free += g.Free()
		d := h.gpu(g)
		if m, ok := gm[d.ProviderUUID]; ok {
			d.Drained, d.DrainReason = m.Drained, m.DrainReason
		}
		x.Detail = append(x.Detail, d)
	}
	// The mixed bridge-owned GPUs, which the index never holds: a host
	// whose only GPUs are mixed is listed too.
	mixed, err := h.svc.MixedGPUs(c.Request().Context())
	if err != nil {
		return nil, err
	}
	for _, m := range mixed {
		x, ok := hosts[m.Node]
		if !ok {
			x = &Host{Name: m.Host, Node: m.Node, RootUUID: m.RootUUID, Traits: []string{}}
			hk, ok := hm[x.Name]
			if !ok {
				hk = hm[x.Node]
			}
			x.Drained, x.DrainReason, x.Disabled, x.DisabledReason = hk.Drained, hk.DrainReason, hk.Disabled, hk.DisabledReason
			hosts[m.Node] = x
		}
		if x.RootUUID == "" {
			x.RootUUID = m.RootUUID
		}
		if x.Name == x.Node && m.Host != "" {
			x.Name = m.Host // the declaration names the compute host
		}
		d := h.mixed(m)
		if mk, ok := gm[d.ProviderUUID]; ok && d.ProviderUUID != "" {
			d.Drained, d.DrainReason = mk.Drained, mk.DrainReason
		}
		x.GPUs++
		x.MixedGPUs++
		if x.Framebuffer == nil {
			x.Framebuffer = &Framebuffer{}
		}
		x.Framebuffer.TotalMiB += d.Framebuffer.TotalMiB
		x.Framebuffer.UsedMiB += d.Framebuffer.UsedMiB
		x.Framebuffer.FreeMiB += d.Framebuffer.FreeMiB
		x.Detail = append(x.Detail, d)
	}
	return hosts, nil
}

func (h *Handlers) hosts(c echo.Context) error {
	m, err := h.hostList(c)
	if err != nil {
		return err
	}
	out := make([]Host, 0, len(m))
	for _, x := range m {
		x.Detail = nil
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return c.JSON(http.StatusOK, map[string]any{"hosts": out})
}

func (h *Handlers) host(c echo.Context) error {
	name := c.Param("name")
	hl, err := h.hostList(c)
	if err != nil {
		return err
	}
	for _, x := range hl {
		if x.Name == name || x.Node == name {
			return c.JSON(http.StatusOK, x)
		}
	}
	return api.Problem(http.StatusNotFound, "Not Found", "no host or node named "+name+" holds GPUs")
}

func (h *Handlers) allocations(c echo.Context) error {
	inst := c.QueryParam("instance")
	if inst != "" {
		if _, err := uuid.Parse(inst); err != nil {
			return api.ValidationProblem([]api.InvalidParam{{Name: "instance", Reason: "must be an instance UUID"}})
		}
	}
	st := h.svc.Store()
	if st == nil {
		return api.Problem(http.StatusServiceUnavailable, "No mirror", "the placement mirror is not configured")
	}
	// A project-scoped caller sees its project's instances' allocations,
	// and, as Nova shows its members, not which host or GPU holds them.
	project := ""
	if p := api.PrincipalFrom(c); p != nil {
		project = p.Project
	}
	al, err := st.ProjectAllocations(c.Request().Context(), inst, project)
	if err != nil {
		return err
	}
	type row struct {
		Instance   string `json:"instance_uuid"`
		Provider   string `json:"provider_uuid,omitempty"`
		Class      string `json:"resource_class"`
		Amount     int    `json:"amount"`
		Host       string `json:"host,omitempty"`
		PCIAddress string `json:"pci_address,omitempty"`
		Profile    string `json:"profile,omitempty"`
	}
	out := make([]row, 0, len(al))
	for _, a := range al {
		r := row{Instance: a.Consumer, Provider: a.Provider, Class: a.Class, Amount: a.Used}
		if g, ok := h.svc.Index().Lookup(a.Provider); ok {
			r.Host, r.PCIAddress = h.svc.HostName(g.Host.Name), g.PCIAddress()
			if len(g.Types) > 0 {
				r.Profile = h.svc.ProfileName(g.Types[0])
			} else if g.Class == placement.BridgeClass {
				r.Profile = h.svc.ProfileName(placement.OwnedTypeTrait(g.Traits))
			}
		}
		if project != "" {
			r.Provider, r.Host, r.PCIAddress = "", "", ""
		}
		out = append(out, r)
	}
	return c.JSON(http.StatusOK, map[string]any{"allocations": out})
}
