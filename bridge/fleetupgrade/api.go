// SPDX-License-Identifier: Apache-2.0

package fleetupgrade

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/novaconf"
)

//go:embed openapi.json
var openAPI []byte

// MaxHosts bounds the hosts of one run.
const MaxHosts = 500

// API serves POST /v1/fleet/upgrades and GET /v1/fleet/upgrades/{id}.
type API struct {
	Store  *Store
	Pool   *pgxpool.Pool
	Compat func() Compat
	// Ready says why runs cannot start ("" when they can): host
	// maintenance needs [nova].
	Ready   func() string
	Started func() // the runner looks at once
	// Retyper computes re-type runs' nova.conf changes (placement.Service);
	// nil: POST /v1/fleet/retypes answers 503.
	Retyper Retyper
}

// Retyper computes the nova.conf change that re-types Nova-owned GPUs of
// a host (placement.Service.NovaRetype).
type Retyper interface {
	NovaRetype(ctx context.Context, host string, want map[string]string, allowInUse bool) (novaconf.Change, error)
}

// Register adds the routes.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/fleet/upgrades", api.Admin, a.start)
	srv.Handle(http.MethodGet, "/v1/fleet/upgrades/:id", api.Admin, a.get)
	srv.Handle(http.MethodPost, "/v1/fleet/retypes", api.Admin, a.startRetype)
	srv.Handle(http.MethodGet, "/v1/fleet/retypes/:id", api.Admin, a.get)
	srv.Describe(openAPI)
}

// StartBody is the body of POST /v1/fleet/upgrades.
type StartBody struct {
	Branch         string   `json:"branch"`
	Version        string   `json:"version"`
	Hosts          []string `json:"hosts"`
	MaxUnavailable *int     `json:"max_unavailable"`
	StopOnFailure  *bool    `json:"stop_on_failure"`
	DryRun         bool     `json:"dry_run"`
}

// PlanHost is one host of a dry run.
type PlanHost struct {
	Host    string `json:"host"`
	Driver  string `json:"driver,omitempty"`
	Drained bool   `json:"drained"`
	VGPUs   int    `json:"vgpus"` // active vGPUs its agent last reported
}

// Plan is the answer of a dry run: what a run would do, and what refuses it.
type Plan struct {
	Options  Options    `json:"options"`
	Hosts    []PlanHost `json:"hosts"`
	Refusals []Refusal  `json:"refusals"`
	Steps    []string   `json:"steps"`
}

// Steps are what a run does on each host.
var Steps = []string{"check the guests' drivers against the target branch", "drain", "move the vGPU VMs off (host maintenance)",
	"upgrade_driver (the agent's driver_upgrade_command)", "wait for the agent to report the target branch",
	"diagnose (no error or critical finding)", "undrain (when the run drained it)"}

// Options reads and checks a start body.
func (b StartBody) Options() (Options, []api.InvalidParam) {
	o := Options{Branch: b.Branch, Version: b.Version, MaxUnavailable: 1, StopOnFailure: true}
	if b.MaxUnavailable != nil {
		o.MaxUnavailable = *b.MaxUnavailable
	}
	if b.StopOnFailure != nil {
		o.StopOnFailure = *b.StopOnFailure
	}
	var bad []api.InvalidParam
	if err := (&protocol.UpgradeParams{Branch: o.Branch, Version: o.Version}).Validate(protocol.UpgradeDriver); err != nil {
		bad = append(bad, api.InvalidParam{Name: "branch", Reason: err.Error()})
	}
	seen := map[string]bool{}
	for _, h := range b.Hosts {
		h = strings.TrimSpace(h)
		switch {
		case h == "" || len(h) > 255:
			bad = append(bad, api.InvalidParam{Name: "hosts", Reason: fmt.Sprintf("host name %q: want 1 to 255 characters", h)})
		case seen[h]:
			bad = append(bad, api.InvalidParam{Name: "hosts", Reason: "host " + h + " is listed twice"})
		default:
			seen[h] = true
			o.Hosts = append(o.Hosts, h)
		}
	}
	if len(b.Hosts) == 0 || len(b.Hosts) > MaxHosts {
		bad = append(bad, api.InvalidParam{Name: "hosts", Reason: fmt.Sprintf("want 1 to %d hosts", MaxHosts)})
	}
	if o.MaxUnavailable < 1 || o.MaxUnavailable > len(b.Hosts) && len(b.Hosts) > 0 {
		bad = append(bad, api.InvalidParam{Name: "max_unavailable", Reason: fmt.Sprintf("%d: want 1 to the number of hosts", o.MaxUnavailable)})
	}
	return o, bad
}

func (a *API) start(c echo.Context) error {
	ctx := c.Request().Context()
	var b StartBody
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return api.ValidationProblem([]api.InvalidParam{{Name: "body", Reason: "not a fleet upgrade body: " + err.Error()}})
	}
	o, bad := b.Options()
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	p, unknown, err := a.plan(ctx, o)
	if err != nil {
		return err
	}
	if len(unknown) > 0 {
		return &api.ProblemDetails{Status: http.StatusNotFound, Title: "Host not found", Code: "host_not_found",
			Detail: "no agent of these hosts ever reported: " + strings.Join(unknown, ", ")}
	}
	if b.DryRun {
		return c.JSON(http.StatusOK, p)
	}
	if len(p.Refusals) > 0 {
		r := p.Refusals[0]
		return &api.ProblemDetails{Status: http.StatusConflict, Title: "Driver branch incompatible", Code: "driver_incompatible",
			Detail: fmt.Sprintf("branch %s cannot serve %d guest driver(s), e.g. %s of instance %s on %s: %s (dry_run lists them all)",
				o.Branch, len(p.Refusals), r.Guest, r.Instance, r.Host, r.Reason)}
	}
	if a.Ready != nil {
		if why := a.Ready(); why != "" {
			return api.Problem(http.StatusServiceUnavailable, "Fleet upgrades unavailable", why)
		}
	}
	return a.record(ctx, c, o, "/v1/fleet/upgrades/")
}

// plan reads the hosts and checks the target against their guests.
func (a *API) plan(ctx context.Context, o Options) (Plan, []string, error) {
	p := Plan{Options: o, Steps: Steps, Hosts: []PlanHost{}, Refusals: []Refusal{}}
	var unknown []string
	for _, h := range o.Hosts {
		var ph PlanHost
		var driver *string
		var rep []byte
		err := a.Pool.QueryRow(ctx, `SELECT name, driver_version, drained, report FROM hosts WHERE name = $1`, h).Scan(&ph.Host, &driver, &ph.Drained, &rep)
		if errors.Is(err, pgx.ErrNoRows) {
			unknown = append(unknown, h)
			continue
		}
		if err != nil {
			return p, nil, fmt.Errorf("read host %s: %w", h, err)
		}
		ph.Driver = deref(driver)
		var r protocol.Report
		if len(rep) > 0 && json.Unmarshal(rep, &r) == nil {
			for _, g := range r.GPUs {
				ph.VGPUs += len(g.Active)
			}
		}
		p.Hosts = append(p.Hosts, ph)
	}
	var c Compat
	if a.Compat != nil {
		c = a.Compat()
	}
	ref, err := CheckCompat(ctx, a.Pool, c, o.Hosts, o.Branch, o.Version)
	if err != nil {
		return p, nil, err
	}
	p.Refusals = append(p.Refusals, ref...)
	return p, unknown, nil
}

func (a *API) get(c echo.Context) error {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return api.Problem(http.StatusNotFound, "Fleet upgrade not found", "no fleet upgrade "+c.Param("id"))
	}
	op, err := a.Store.Get(c.Request().Context(), id)
	if errors.Is(err, ErrNotFound) {
		return api.Problem(http.StatusNotFound, "Fleet upgrade not found", "no fleet upgrade "+id.String())
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, op)
}

// RetypeBody is the body of POST /v1/fleet/retypes.
type RetypeBody struct {
	GPUs          []string `json:"gpus"` // HOST/PCI=TYPE
	StopOnFailure *bool    `json:"stop_on_failure"`
	DryRun        bool     `json:"dry_run"`
}

// RetypePlanHost is one host of a re-type dry run.
type RetypePlanHost struct {
	Host    string          `json:"host"`
	Drained bool            `json:"drained"`
	Change  novaconf.Change `json:"nova_conf_change"`
}

// RetypePlan is the answer of a re-type dry run.
type RetypePlan struct {
	Options Options          `json:"options"`
	Hosts   []RetypePlanHost `json:"hosts"`
	Steps   []string         `json:"steps"`
}

// ParseRetypeGPU reads HOST/PCI=TYPE.
func ParseRetypeGPU(s string) (host, pci, typ string, err error) {
	host, rest, ok := strings.Cut(strings.TrimSpace(s), "/")
	if ok {
		pci, typ, ok = strings.Cut(rest, "=")
	}
	if !ok || host == "" || pci == "" || typ == "" || len(host) > 255 {
		return "", "", "", fmt.Errorf("%q: want HOST/PCI=TYPE, e.g. compute-1/0000:3b:00.0=nvidia-222", s)
	}
	return host, strings.ToLower(pci), typ, nil
}

// RetypeOptions reads and checks a re-type body: the hosts in the order
// they first appear, each with its GPUs' new types.
func (b RetypeBody) RetypeOptions() (Options, map[string]map[string]string, []api.InvalidParam) {
	o := Options{Kind: KindRetype, MaxUnavailable: 1, StopOnFailure: true}
	if b.StopOnFailure != nil {
		o.StopOnFailure = *b.StopOnFailure
	}
	want := map[string]map[string]string{}
	var bad []api.InvalidParam
	for _, g := range b.GPUs {
		host, pci, typ, err := ParseRetypeGPU(g)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "gpus", Reason: err.Error()})
			continue
		}
		if want[host] == nil {
			want[host] = map[string]string{}
			o.Hosts = append(o.Hosts, host)
		}
		if _, dup := want[host][pci]; dup {
			bad = append(bad, api.InvalidParam{Name: "gpus", Reason: "GPU " + host + "/" + pci + " is listed twice"})
		}
		want[host][pci] = typ
	}
	if len(b.GPUs) == 0 || len(o.Hosts) > MaxHosts {
		bad = append(bad, api.InvalidParam{Name: "gpus", Reason: fmt.Sprintf("want 1 or more GPUs on at most %d hosts", MaxHosts)})
	}
	return o, want, bad
}

func (a *API) startRetype(c echo.Context) error {
	ctx := c.Request().Context()
	var b RetypeBody
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return api.ValidationProblem([]api.InvalidParam{{Name: "body", Reason: "not a fleet retype body: " + err.Error()}})
	}
	o, want, bad := b.RetypeOptions()
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	if a.Retyper == nil {
		return api.Problem(http.StatusServiceUnavailable, "Fleet retypes unavailable", "this bridge has no Placement service")
	}
	p := RetypePlan{Options: o, Steps: RetypeSteps, Hosts: []RetypePlanHost{}}
	o.Retypes = map[string]novaconf.Change{}
	for _, h := range o.Hosts {
		ch, err := a.Retyper.NovaRetype(ctx, h, want[h], false)
		switch {
		case errors.Is(err, placement.ErrHostNotReported):
			return &api.ProblemDetails{Status: http.StatusNotFound, Title: "Host not found", Code: "host_not_found", Detail: err.Error()}
		case errors.Is(err, novaconf.ErrInUse):
			return &api.ProblemDetails{Status: http.StatusConflict, Title: "GPU in use", Code: "gpu_in_use", Detail: err.Error()}
		case errors.Is(err, novaconf.ErrNotNovaGPU), errors.Is(err, novaconf.ErrNotCreatable), errors.Is(err, novaconf.ErrNoChange),
			errors.Is(err, novaconf.ErrTypeMalformed):
			return api.ValidationProblem([]api.InvalidParam{{Name: "gpus", Reason: err.Error()}})
		case err != nil:
			return err
		}
		o.Retypes[h] = ch
		ph := RetypePlanHost{Host: h, Change: ch}
		if err := a.Pool.QueryRow(ctx, `SELECT drained FROM hosts WHERE name = $1`, h).Scan(&ph.Drained); err != nil {
			return fmt.Errorf("read host %s: %w", h, err)
		}
		p.Hosts = append(p.Hosts, ph)
	}
	p.Options = o
	if b.DryRun {
		return c.JSON(http.StatusOK, p)
	}
	return a.record(ctx, c, o, "/v1/fleet/retypes/")
}

// record records a run of o for the caller and wakes the runner: 202 with
// the run and its Location (under base), 409 upgrade_running while
// another run is active.
func (a *API) record(ctx context.Context, c echo.Context, o Options, base string) error {
	who := controls.Actor{Name: "anonymous", RequestID: api.RequestID(c)}
	if pr := api.PrincipalFrom(c); pr != nil && pr.Name != "" {
		who.Name = pr.Name
	}
	op, err := a.Store.Create(ctx, who, o)
	if errors.Is(err, ErrBusy) {
		return &api.ProblemDetails{Status: http.StatusConflict, Title: "Upgrade running", Code: "upgrade_running", Detail: err.Error()}
	}
	if err != nil {
		return err
	}
	if a.Started != nil {
		a.Started()
	}
	c.Response().Header().Set("Location", base+op.ID.String())
	return c.JSON(http.StatusAccepted, op)
}
