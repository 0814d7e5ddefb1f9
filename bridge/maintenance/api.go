// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

//go:embed openapi.json
var openAPI []byte

// Lister is what planning needs of Nova besides the executor's calls.
type Lister interface {
	ServersOnHost(ctx context.Context, host, requestID string) ([]computeapi.ServerRef, error)
	Server(ctx context.Context, id, requestID string) (computeapi.Server, error)
}

// API serves POST /v1/hosts/{name}/migrate-all and the operations.
type API struct {
	Store    *Store
	Pool     *pgxpool.Pool
	Nova     Lister // nil: [nova] is not configured, the routes answer 503
	Drain    Drainer
	Known    func(host string) bool // a host of the Placement index
	Chooser  func() Chooser         // a fresh Chooser per plan
	Defaults Options                // LiveMigrateVGPU from [maintenance]
	Started  func()                 // the executor looks at once
	Poll     time.Duration          // how often Wait reads the operation (default 2s)
}

// Register adds the routes.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/hosts/:name/migrate-all", api.Admin, a.start)
	srv.Handle(http.MethodGet, "/v1/hosts/:name/migrate-all", api.Admin, a.latest)
	srv.Handle(http.MethodGet, "/v1/maintenance/:id", api.Admin, a.get)
	srv.Describe(openAPI)
}

// StartBody is the body of POST /v1/hosts/{name}/migrate-all.
type StartBody struct {
	Concurrency   *int   `json:"concurrency"`
	StopOnFailure *bool  `json:"stop_on_failure"`
	DryRun        bool   `json:"dry_run"`
	Target        string `json:"target"`
}

// DryRunAnswer is the answer of a dry run.
type DryRunAnswer struct {
	Plan Plan   `json:"plan"`
	Text string `json:"text"`
}

func (a *API) start(c echo.Context) error {
	ctx := c.Request().Context()
	host := c.Param("name")
	var b StartBody
	if c.Request().ContentLength != 0 {
		dec := json.NewDecoder(c.Request().Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil {
			return api.ValidationProblem([]api.InvalidParam{{Name: "body", Reason: "not a migrate-all body: " + err.Error()}})
		}
	}
	o := DefaultOptions()
	o.LiveMigrateVGPU = a.Defaults.LiveMigrateVGPU
	if b.Concurrency != nil {
		o.Concurrency = *b.Concurrency
	}
	if b.StopOnFailure != nil {
		o.StopOnFailure = *b.StopOnFailure
	}
	o.DryRun, o.Target = b.DryRun, b.Target
	if err := o.Validate(host); err != nil || o.Concurrency == 0 {
		reason := fmt.Sprintf("concurrency %d: want 1 to %d", o.Concurrency, MaxConcurrency)
		if err != nil {
			reason = err.Error()
		}
		return api.ValidationProblem([]api.InvalidParam{{Name: "options", Reason: reason}})
	}
	if a.Nova == nil {
		return api.Problem(http.StatusServiceUnavailable, "Nova not configured", "host maintenance moves VMs through Nova: configure [nova]")
	}
	drained, known, err := a.hostState(ctx, host)
	if err != nil {
		return err
	}
	if !known {
		return api.Problem(http.StatusNotFound, "Host not found", "no host named "+host+" is known (from agents' reports or the Placement mirror)")
	}
	if o.Target != "" {
		if _, ok, err := a.hostState(ctx, o.Target); err != nil || !ok {
			return api.Problem(http.StatusNotFound, "Host not found", "no target host named "+o.Target+" is known")
		}
	}
	vms, err := a.readVMs(ctx, host)
	if err != nil {
		return &api.ProblemDetails{Status: http.StatusBadGateway, Title: "Nova unavailable", Code: "nova_unavailable", Detail: err.Error()}
	}
	var ch Chooser
	if a.Chooser != nil {
		ch = a.Chooser()
	}
	p, err := Build(host, drained, vms, o, ch)
	if err != nil {
		return api.ValidationProblem([]api.InvalidParam{{Name: "options", Reason: err.Error()}})
	}
	if o.DryRun {
		var sb strings.Builder
		if err := p.Render(&sb); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, DryRunAnswer{Plan: p, Text: sb.String()})
	}
	who := controls.Actor{Name: "anonymous", RequestID: api.RequestID(c)}
	if pr := api.PrincipalFrom(c); pr != nil && pr.Name != "" {
		who.Name = pr.Name
	}
	if busy, err := a.runningOn(ctx, host); err != nil {
		return err
	} else if busy != uuid.Nil {
		return busyProblem(host, busy)
	}
	if p.Drain {
		if _, err := a.Drain.DrainHost(ctx, who, host, "host maintenance: vgpuctl host migrate-all", true, a.Known); err != nil {
			return fmt.Errorf("drain %s: %w", host, err)
		}
	}
	op, err := a.Store.Create(ctx, who, p, p.Drain)
	if errors.Is(err, ErrBusy) {
		busy, _ := a.runningOn(ctx, host)
		return busyProblem(host, busy)
	}
	if err != nil {
		if p.Drain { // the drain was the operation's: undo it
			_, _ = a.Drain.DrainHost(context.WithoutCancel(ctx), who, host, "", false, nil)
		}
		return err
	}
	if a.Started != nil {
		a.Started()
	}
	c.Response().Header().Set("Location", "/v1/maintenance/"+op.ID.String())
	return c.JSON(http.StatusAccepted, op)
}

func busyProblem(host string, op uuid.UUID) error {
	return &api.ProblemDetails{Status: http.StatusConflict, Title: "Operation running", Code: "maintenance_running",
		Detail: fmt.Sprintf("maintenance operation %s is running on host %s already", op, host)}
}

func (a *API) runningOn(ctx context.Context, host string) (uuid.UUID, error) {
	var id uuid.UUID
	err := a.Pool.QueryRow(ctx, `SELECT id FROM maintenance_operations WHERE host = $1 AND state = 'running'`, host).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, nil
	}
	return id, err
}

// hostState reads whether host is drained and whether it is known.
func (a *API) hostState(ctx context.Context, host string) (drained, known bool, err error) {
	err = a.Pool.QueryRow(ctx, `SELECT drained FROM hosts WHERE name = $1`, host).Scan(&drained)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, a.Known != nil && a.Known(host), nil
	}
	if err != nil {
		return false, false, fmt.Errorf("read host %s: %w", host, err)
	}
	return drained, true, nil
}

// readVMs reads the instances on host that hold a vGPU: Nova's flavor
// units, or the bridge's attachments.
func (a *API) readVMs(ctx context.Context, host string) ([]VM, error) {
	refs, err := a.Nova.ServersOnHost(ctx, host, "")
	if err != nil {
		return nil, err
	}
	var out []VM
	for _, r := range refs {
		s, err := a.Nova.Server(ctx, r.ID, "")
		if err != nil {
			return nil, err
		}
		vm := VM{Instance: s.ID, Name: s.Name, Status: s.Status, TaskState: s.TaskState}
		if n, err := strconv.Atoi(s.Flavor.ExtraSpecs["resources:VGPU"]); err == nil {
			vm.FlavorVGPUs = n
		}
		if vm.Direct, err = Direct(ctx, a.Pool, s.ID, uuid.Nil); err != nil {
			return nil, err
		}
		if vm.FlavorVGPUs > 0 || len(vm.Direct) > 0 {
			out = append(out, vm)
		}
	}
	return out, nil
}

func (a *API) latest(c echo.Context) error {
	var id uuid.UUID
	err := a.Pool.QueryRow(c.Request().Context(), `SELECT id FROM maintenance_operations WHERE host = $1
		ORDER BY (state = 'running') DESC, created_at DESC LIMIT 1`, c.Param("name")).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Problem(http.StatusNotFound, "Operation not found", "no maintenance operation on host "+c.Param("name"))
	}
	if err != nil {
		return err
	}
	return a.answer(c, id)
}

func (a *API) get(c echo.Context) error {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return api.Problem(http.StatusNotFound, "Operation not found", "no maintenance operation "+c.Param("id"))
	}
	return a.answer(c, id)
}

func (a *API) answer(c echo.Context, id uuid.UUID) error {
	op, err := a.Store.Get(c.Request().Context(), id)
	if errors.Is(err, ErrNotFound) {
		return api.Problem(http.StatusNotFound, "Operation not found", "no maintenance operation "+id.String())
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, op)
}
