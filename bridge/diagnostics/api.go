// SPDX-License-Identifier: Apache-2.0

package diagnostics

import (
	_ "embed"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
)

//go:embed openapi.json
var openAPI []byte

// MaxTimeout bounds the timeout a request may give its agent.
const MaxTimeout = time.Hour

// API serves the diagnostics routes (all admin).
type API struct {
	Store *Store
	// Kick, when set, wakes the outbox relay after a command is queued.
	Kick func()
}

// Register adds the routes and their OpenAPI description to srv.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/hosts/:name/diagnostics", api.Admin, a.request)
	srv.Handle(http.MethodGet, "/v1/diagnostics/:id", api.Admin, a.get)
	srv.Handle(http.MethodGet, "/v1/diagnostics/:id/bundle", api.Admin, a.bundle)
	srv.Describe(openAPI)
}

// RequestBody is the body of POST /v1/hosts/{name}/diagnostics.
type RequestBody struct {
	// Instance limits the domain XML to this instance.
	Instance string `json:"instance,omitempty"`
	// TimeoutSeconds is how long the agent has to answer (default 600).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
}

func actor(c echo.Context) controls.Actor {
	who := controls.Actor{Name: "anonymous", RequestID: api.RequestID(c)}
	if p := api.PrincipalFrom(c); p != nil && p.Name != "" {
		who.Name = p.Name
	}
	return who
}

func (a *API) request(c echo.Context) error {
	var b RequestBody
	if c.Request().ContentLength != 0 {
		if err := api.DecodeJSON(c, &b); err != nil {
			return err
		}
	}
	var bad []api.InvalidParam
	if b.Instance != "" {
		if _, err := uuid.Parse(b.Instance); err != nil {
			bad = append(bad, api.InvalidParam{Name: "instance", Reason: "an instance UUID"})
		}
	}
	if b.TimeoutSeconds < 0 || time.Duration(b.TimeoutSeconds)*time.Second > MaxTimeout {
		bad = append(bad, api.InvalidParam{Name: "timeout_seconds", Reason: "0 (default 600) to " + strconv.Itoa(int(MaxTimeout.Seconds()))})
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	host := c.Param("name")
	d, err := a.Store.Request(c.Request().Context(), actor(c), host, b.Instance, time.Duration(b.TimeoutSeconds)*time.Second)
	if errors.Is(err, ErrNotFound) {
		return api.Problem(http.StatusNotFound, "Host not found", "no agent of a host named "+host+" has reported to the bridge")
	}
	if err != nil {
		return err
	}
	if a.Kick != nil {
		a.Kick()
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/diagnostics/"+d.ID)
	return c.JSON(http.StatusAccepted, d)
}

func notFound(id string) error {
	return api.Problem(http.StatusNotFound, "Diagnostics not found", "no diagnostics request has id "+id+" (purged, or never made)")
}

func (a *API) get(c echo.Context) error {
	d, err := a.Store.Get(c.Request().Context(), c.Param("id"))
	if errors.Is(err, ErrNotFound) {
		return notFound(c.Param("id"))
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}

func (a *API) bundle(c echo.Context) error {
	d, b, ok, err := a.Store.Bundle(c.Request().Context(), c.Param("id"))
	if errors.Is(err, ErrNotFound) {
		return notFound(c.Param("id"))
	}
	if err != nil {
		return err
	}
	if !ok {
		detail := "the bundle is " + d.Status
		if d.Error != "" {
			detail += ": " + d.Error
		}
		return api.Problem(http.StatusConflict, "Bundle not available", detail)
	}
	h := c.Response().Header()
	h.Set("Content-Disposition", `attachment; filename="diagnostics-`+d.Host+`-`+d.ID+`.tar.gz"`)
	h.Set("X-Bundle-SHA256", d.SHA256)
	return c.Blob(http.StatusOK, "application/gzip", b)
}
