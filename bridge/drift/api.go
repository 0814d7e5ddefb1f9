package drift

import (
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift/driftwire"
)

//go:embed openapi.json
var openAPI []byte

// Record is a finding as GET /v1/drift answers it.
type Record = driftwire.Record

// Answer is the body of GET /v1/drift.
type Answer struct {
	Findings []Record   `json:"findings"`
	LastRun  *RunResult `json:"last_run"`
	Repair   bool       `json:"repair"`
	Interval string     `json:"interval"`
}

// Register adds GET /v1/drift and POST /v1/drift/run and their OpenAPI
// description to srv.
func (r *Reconciler) Register(srv *api.Server) {
	srv.Handle(http.MethodGet, "/v1/drift", api.Fleet, r.list)
	srv.Handle(http.MethodPost, "/v1/drift/run", api.Admin, r.runNow)
	srv.Describe(openAPI)
}

func (r *Reconciler) list(c echo.Context) error {
	q := c.QueryParams()
	var bad []api.InvalidParam
	state := q.Get("state")
	switch state {
	case "", "open", "resolved", "all":
	default:
		bad = append(bad, api.InvalidParam{Name: "state", Reason: "must be open, resolved or all"})
	}
	kind := q.Get("kind")
	if kind != "" {
		ok := false
		for _, k := range Kinds {
			ok = ok || string(k) == kind
		}
		if !ok {
			bad = append(bad, api.InvalidParam{Name: "kind", Reason: fmt.Sprintf("must be one of %v", Kinds)})
		}
	}
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			bad = append(bad, api.InvalidParam{Name: "limit", Reason: "must be an integer from 1 to 1000"})
		}
		limit = n
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	ctx := c.Request().Context()
	where := `resolved_at IS NULL`
	switch state {
	case "resolved":
		where = `resolved_at IS NOT NULL`
	case "all":
		where = `true`
	}
	rows, err := r.d.Pool.Query(ctx, `SELECT id, kind, host, provider_uuid::text, pci_address, instance_uuid::text, mdev_uuid::text, detail,
			repairable, repaired, repair, repair_request_id::text, repaired_at, first_seen, last_seen, seen, resolved_at
		FROM drift_findings WHERE `+where+` AND ($1 = '' OR kind = $1) AND ($2 = '' OR host = $2)
		ORDER BY last_seen DESC, id DESC LIMIT $3`, kind, q.Get("host"), limit)
	if err != nil {
		return fmt.Errorf("read findings: %w", err)
	}
	defer rows.Close()
	ans := Answer{Findings: []Record{}, Repair: r.cfg.Repair, Interval: r.cfg.Interval.String()}
	for rows.Next() {
		var f Record
		if err := rows.Scan(&f.ID, &f.Kind, &f.Host, &f.ProviderUUID, &f.PCIAddress, &f.InstanceUUID, &f.MdevUUID, &f.Detail,
			&f.Repairable, &f.Repaired, &f.Repair, &f.RepairRequestID, &f.RepairedAt, &f.FirstSeen, &f.LastSeen, &f.Seen, &f.ResolvedAt); err != nil {
			return err
		}
		ans.Findings = append(ans.Findings, f)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	var run RunResult
	var errText *string
	err = r.d.Pool.QueryRow(ctx, `SELECT id, coalesce(replica,''), started_at, finished_at, findings, new_findings, resolved, repairs,
			coalesce(skipped_hosts, '{}'), error FROM drift_runs ORDER BY id DESC LIMIT 1`).
		Scan(&run.ID, &run.Replica, &run.StartedAt, &run.FinishedAt, &run.Findings, &run.New, &run.Resolved, &run.Repairs, &run.SkippedHosts, &errText)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return err
	default:
		if errText != nil {
			run.Error = *errText
		}
		ans.LastRun = &run
	}
	return c.JSON(http.StatusOK, ans)
}

func (r *Reconciler) runNow(c echo.Context) error {
	res, err := r.RunOnce(c.Request().Context())
	if errors.Is(err, ErrBusy) {
		p := api.Problem(http.StatusConflict, "Drift run in progress", err.Error())
		p.Headers = map[string]string{"Retry-After": "5"}
		return p
	}
	if err != nil {
		return api.Problem(http.StatusBadGateway, "Drift run failed", err.Error())
	}
	return c.JSON(http.StatusOK, res)
}
