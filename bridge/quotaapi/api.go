// Package quotaapi serves GET /v1/quota: a project's vGPU limits and
// usage as the bridge sees them (vgpuctl quota show).
package quotaapi

import (
	"context"
	_ "embed"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
)

//go:embed openapi.json
var openAPI []byte

// API serves GET /v1/quota.
type API struct {
	// Quota reads a project's view (pipeline.Processor.Quota).
	Quota func(ctx context.Context, project string) (pipeline.QuotaView, error)
}

// Register adds the route and its OpenAPI description to srv.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodGet, "/v1/quota", api.Project, a.get)
	srv.Describe(openAPI)
}

func (a *API) get(c echo.Context) error {
	project := c.QueryParam("project")
	if p := api.PrincipalFrom(c); p != nil && p.Project != "" {
		if project != "" && project != p.Project {
			return &api.ProblemDetails{Status: http.StatusForbidden, Title: "Forbidden", Code: "project_not_allowed",
				Detail: "a project-scoped token sees its own project's quota only"}
		}
		project = p.Project
	}
	if project == "" {
		return api.ValidationProblem([]api.InvalidParam{{Name: "project", Reason: "is required without a project-scoped token"}})
	}
	v, err := a.Quota(c.Request().Context(), project)
	if errors.Is(err, pipeline.ErrLimitsUnavailable) {
		return &api.ProblemDetails{Status: http.StatusServiceUnavailable, Title: "Service Unavailable", Code: "limits_unavailable",
			Detail: err.Error()}
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}
