package ui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

// HostReport is the answer of GET /v1/hosts/{name}/report: the host's
// last agent report as the bridge keeps it (agent/protocol's Report).
type HostReport struct {
	Name         string          `json:"name"`
	Node         string          `json:"node,omitempty"`
	LastReportAt *time.Time      `json:"last_report_at"`
	Report       json.RawMessage `json:"report"`
}

// hostReport answers GET /v1/hosts/{name}/report; name is the host's
// name or its compute node's.
func (h *Handler) hostReport(c echo.Context) error {
	if h.cfg.Pool == nil {
		return api.Problem(http.StatusServiceUnavailable, "No database", "the bridge has no database")
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 5*time.Second)
	defer cancel()
	name := c.Param("name")
	var r HostReport
	err := h.cfg.Pool.QueryRow(ctx, `SELECT name, coalesce(node, ''), last_report_at, report FROM hosts
		WHERE (name = $1 OR node = $1) AND report IS NOT NULL ORDER BY name = $1 DESC, name LIMIT 1`, name).
		Scan(&r.Name, &r.Node, &r.LastReportAt, &r.Report)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Problem(http.StatusNotFound, "Not Found", "no agent report of a host or node named "+name)
	}
	if err != nil {
		return fmt.Errorf("host report %s: %w", name, err)
	}
	return c.JSON(http.StatusOK, r)
}
