package usage

import (
	"context"
	_ "embed"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/usage/usagewire"
)

//go:embed openapi.json
var openAPI []byte

// API serves GET /v1/usage.
type API struct {
	Pool   *pgxpool.Pool
	Period Period
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

// Register adds the route and its OpenAPI description to srv.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodGet, "/v1/usage", api.Project, a.get)
	srv.Describe(openAPI)
}

// groupColumns maps group_by names to vgpu_usage columns.
var groupColumns = map[string]string{
	"project":   "coalesce(project_id,'')",
	"user":      "coalesce(user_id,'')",
	"instance":  "instance_uuid::text",
	"profile":   "coalesce(profile,'')",
	"vgpu_type": "coalesce(vgpu_type,'')",
	"host":      "coalesce(host,'')",
	"path":      "path",
}

// groupOrder is the order of columns in answers whatever the order asked.
var groupOrder = usagewire.Groups

// DefaultGroupBy is group_by when none is given.
var DefaultGroupBy = []string{"project", "instance", "profile"}

// Query is what GET /v1/usage asks.
type Query struct {
	Start, End time.Time
	Project    string
	Profile    string
	Instance   string
	GroupBy    []string
}

// Row is one group's usage.
type Row = usagewire.Row

// Report is GET /v1/usage's answer.
type Report = usagewire.Report

func (a *API) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *API) get(c echo.Context) error {
	q, bad := a.parse(c)
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	if p := api.PrincipalFrom(c); p != nil && p.Project != "" {
		if q.Project != "" && q.Project != p.Project {
			return &api.ProblemDetails{Status: http.StatusForbidden, Title: "Forbidden", Code: "project_not_allowed",
				Detail: "a project-scoped token sees its own project's usage only"}
		}
		q.Project = p.Project
	}
	rep, err := a.Report(c.Request().Context(), q)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

func (a *API) parse(c echo.Context) (Query, []api.InvalidParam) {
	var q Query
	var bad []api.InvalidParam
	now := a.now().UTC()
	q.End = now
	q.Start = a.Period.Start(now)
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"start", &q.Start}, {"end", &q.End}} {
		if s := c.QueryParam(f.name); s != "" {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				bad = append(bad, api.InvalidParam{Name: f.name, Reason: "must be an RFC 3339 time, e.g. 2026-12-01T00:00:00Z"})
				continue
			}
			*f.dst = t.UTC()
		}
	}
	if !q.End.After(q.Start) {
		bad = append(bad, api.InvalidParam{Name: "end", Reason: "must be after start"})
	}
	q.Project, q.Profile = c.QueryParam("project"), c.QueryParam("profile")
	if s := c.QueryParam("instance_uuid"); s != "" {
		if _, err := uuid.Parse(s); err != nil {
			bad = append(bad, api.InvalidParam{Name: "instance_uuid", Reason: "must be a UUID"})
		}
		q.Instance = s
	}
	q.GroupBy = DefaultGroupBy
	if s := c.QueryParam("group_by"); s != "" {
		q.GroupBy = nil
		for _, g := range strings.Split(s, ",") {
			g = strings.TrimSpace(g)
			if _, ok := groupColumns[g]; !ok {
				bad = append(bad, api.InvalidParam{Name: "group_by", Reason: fmt.Sprintf("%q is not one of %s", g, strings.Join(groupOrder, ", "))})
				continue
			}
			if !slices.Contains(q.GroupBy, g) {
				q.GroupBy = append(q.GroupBy, g)
			}
		}
	}
	return q, bad
}

// Report adds up the usage q asks for: each interval's seconds within
// [Start, End) (an open interval counts up to now) times its vGPUs,
// summed per group and rounded to the second.
func (a *API) Report(ctx context.Context, q Query) (Report, error) {
	var cols []string
	var groups []string
	for _, g := range groupOrder {
		if slices.Contains(q.GroupBy, g) {
			cols = append(cols, groupColumns[g])
			groups = append(groups, g)
		}
	}
	rep := Report{Start: q.Start, End: q.End, AuditPeriod: a.Period.String(), GroupBy: groups, Usage: []Row{}}
	sel, group := "", ""
	if len(cols) > 0 {
		sel = strings.Join(cols, ", ") + ", "
		group = "GROUP BY " + strings.Join(cols, ", ") + " ORDER BY " + strings.Join(cols, ", ")
	}
	// The total is rounded once, so it does not depend on the grouping.
	rows, err := a.Pool.Query(ctx, `SELECT `+sel+`round(sum(amount * extract(epoch FROM
			least(coalesce(ended_at, now()), $2) - greatest(started_at, $1))))::bigint,
			round(sum(sum(amount * extract(epoch FROM least(coalesce(ended_at, now()), $2) - greatest(started_at, $1)))) OVER ())::bigint
		FROM vgpu_usage
		WHERE started_at < $2 AND (ended_at IS NULL OR ended_at > $1) AND started_at < now()
		  AND ($3 = '' OR project_id = $3) AND ($4 = '' OR profile = $4) AND ($5 = '' OR instance_uuid::text = $5)
		`+group, q.Start, q.End, q.Project, q.Profile, q.Instance)
	if err != nil {
		return rep, fmt.Errorf("usage: %w", err)
	}
	vals := make([]string, len(groups))
	var secs, total int64
	dst := make([]any, 0, len(groups)+2)
	for i := range vals {
		dst = append(dst, &vals[i])
	}
	dst = append(dst, &secs, &total)
	_, err = pgx.ForEachRow(rows, dst, func() error {
		var r Row
		for i, g := range groups {
			r.SetGroup(g, vals[i])
		}
		r.VGPUSeconds = secs
		rep.Total = total
		rep.Usage = append(rep.Usage, r)
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("usage: %w", err)
	}
	if err := a.Pool.QueryRow(ctx, `SELECT max(period_end) FROM vgpu_usage_periods`).Scan(&rep.ClosedThrough); err != nil {
		return rep, fmt.Errorf("usage: %w", err)
	}
	return rep, nil
}
