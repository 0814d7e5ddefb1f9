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
}

// Register adds the routes.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/fleet/upgrades", api.Admin, a.start)
	srv.Handle(http.MethodGet, "/v1/fleet/upgrades/:id", api.Admin, a.get)
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
	c.Response().Header().Set("Location", "/v1/fleet/upgrades/"+op.ID.String())
	return c.JSON(http.StatusAccepted, op)
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
