package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"
)

// recentWindow bounds the backward scans of the inbox: the newest Nova
// notification is looked for among the last recentWindow rows, so the
// answer stays cheap however large the inbox grows.
const recentWindow = 100000

// lagSample is how many recently processed events the processing lag is
// the median of.
const lagSample = 100

// Status is the answer of GET /v1/status.
type Status struct {
	Time                  time.Time    `json:"time"`
	Version               string       `json:"version"`
	Ingest                Ingest       `json:"ingest"`
	StaleReportAgeSeconds float64      `json:"stale_report_age_seconds"`
	Hosts                 []HostStatus `json:"hosts"`
}

// Ingest is how far behind the bridge is: arrival of Nova notifications,
// and the inbox backlog the pipeline has not processed yet. Fields are
// null when there is nothing to measure.
type Ingest struct {
	// LastNotificationAt is when the newest Nova notification reached the
	// inbox (any replica); NotificationAgeSeconds is how long ago.
	LastNotificationAt     *time.Time `json:"last_notification_at"`
	NotificationAgeSeconds *float64   `json:"notification_age_seconds"`
	// NotificationDelaySeconds is received − emitted of that notification
	// (Nova's timestamp; clock skew between hosts shows here too).
	NotificationDelaySeconds *float64 `json:"notification_delay_seconds"`
	// LastEventAt is the newest inbox row of any source (webhooks too).
	LastEventAt     *time.Time `json:"last_event_at"`
	EventAgeSeconds *float64   `json:"event_age_seconds"`
	// PendingEvents are inbox rows not processed yet; the oldest of them
	// waits since OldestPendingAt. A deferred evaluation (a follow-up a
	// policy cooldown holds back) counts once it is due.
	PendingEvents           int        `json:"pending_events"`
	OldestPendingAt         *time.Time `json:"oldest_pending_at"`
	OldestPendingAgeSeconds *float64   `json:"oldest_pending_age_seconds"`
	// ProcessingLagSeconds is the median of processed − received over the
	// last 100 processed events.
	ProcessingLagSeconds *float64 `json:"processing_lag_seconds"`
	// DeadLetters24h counts dead letters stored in the last 24 hours.
	DeadLetters24h int `json:"dead_letters_24h"`
}

// HostStatus is a compute host as its agent last reported it. Drains and
// Nova's disabled flag are in GET /v1/hosts, next to the capacity they
// take out.
type HostStatus struct {
	Name             string      `json:"name"`
	Node             string      `json:"node,omitempty"`
	AgentVersion     string      `json:"agent_version,omitempty"`
	DriverVersion    string      `json:"driver_version,omitempty"`
	LastReportAt     *time.Time  `json:"last_report_at"`
	ReportAgeSeconds *float64    `json:"report_age_seconds"`
	Stale            bool        `json:"stale"`
	Errors           []string    `json:"errors"`
	GPUs             []GPUHealth `json:"gpus"`
}

// GPUHealth is one GPU of an agent report.
type GPUHealth struct {
	PCI            string   `json:"pci"`
	Name           string   `json:"name,omitempty"`
	Health         string   `json:"health"`
	UtilPercent    *float64 `json:"util_percent,omitempty"`
	MemoryUsedMiB  *uint64  `json:"memory_used_mib,omitempty"`
	MemoryTotalMiB *uint64  `json:"memory_total_mib,omitempty"`
	TemperatureC   *int     `json:"temperature_c,omitempty"`
	VendorVFIO     bool     `json:"vendor_vfio,omitempty"`
}

// statusTTL is how long an answer of GET /v1/status is reused: however
// many dashboards are open, a replica queries the database for it at most
// once per statusTTL (a fleet of 1,000 reporting hosts costs about 0.1 s).
const statusTTL = 2 * time.Second

func (h *Handler) status(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 5*time.Second)
	defer cancel()
	st, err := h.cachedStatus(ctx, time.Now)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

// cachedStatus answers from the last status while it is younger than
// statusTTL, its times moved on by its age. Callers wait for one query
// rather than each running their own.
func (h *Handler) cachedStatus(ctx context.Context, now func() time.Time) (Status, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.cachedAt.IsZero() {
		if age := now().Sub(h.cachedAt); age >= 0 && age < statusTTL {
			return h.cached.aged(age), nil
		}
	}
	st, err := h.Status(ctx)
	if err != nil {
		return st, err
	}
	h.cached, h.cachedAt = st, now()
	return st, nil
}

// aged returns a copy of st as it reads d later: its time and every age
// moved on by d (st itself is not changed).
func (st Status) aged(d time.Duration) Status {
	add := func(p *float64) *float64 {
		if p == nil {
			return nil
		}
		v := *p + d.Seconds()
		return &v
	}
	out := st
	out.Time = st.Time.Add(d)
	out.Ingest.NotificationAgeSeconds = add(st.Ingest.NotificationAgeSeconds)
	out.Ingest.EventAgeSeconds = add(st.Ingest.EventAgeSeconds)
	out.Ingest.OldestPendingAgeSeconds = add(st.Ingest.OldestPendingAgeSeconds)
	out.Hosts = make([]HostStatus, len(st.Hosts))
	for i, x := range st.Hosts {
		x.ReportAgeSeconds = add(x.ReportAgeSeconds)
		out.Hosts[i] = x
	}
	return out
}

// Status reads the status from the database.
func (h *Handler) Status(ctx context.Context) (Status, error) {
	st := Status{Version: h.cfg.Version, StaleReportAgeSeconds: h.cfg.StaleReportAge.Seconds(), Hosts: []HostStatus{}}
	if h.cfg.Pool == nil {
		st.Time = time.Now().UTC()
		return st, nil
	}
	// One snapshot: every age is measured against the same now().
	err := pgx.BeginTxFunc(ctx, h.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&st.Time); err != nil {
			return fmt.Errorf("status: now: %w", err)
		}
		if err := readIngest(ctx, tx, st.Time, &st.Ingest); err != nil {
			return err
		}
		hosts, err := readHosts(ctx, tx, st.Time, h.cfg.StaleReportAge)
		if err != nil {
			return err
		}
		st.Hosts = hosts
		return nil
	})
	st.Time = st.Time.UTC()
	return st, err
}

func readIngest(ctx context.Context, tx pgx.Tx, now time.Time, in *Ingest) error {
	var occurred *time.Time
	err := tx.QueryRow(ctx, `SELECT received_at, occurred_at FROM events
		WHERE source = 'nova' AND id > (SELECT coalesce(max(id), 0) - $1 FROM events)
		ORDER BY id DESC LIMIT 1`, recentWindow).Scan(&in.LastNotificationAt, &occurred)
	if err != nil && err != pgx.ErrNoRows {
		return fmt.Errorf("status: last notification: %w", err)
	}
	if in.LastNotificationAt != nil {
		in.NotificationAgeSeconds = since(now, *in.LastNotificationAt)
		if occurred != nil {
			d := in.LastNotificationAt.Sub(*occurred).Seconds()
			in.NotificationDelaySeconds = &d
		}
	}
	err = tx.QueryRow(ctx, `SELECT received_at FROM events ORDER BY id DESC LIMIT 1`).Scan(&in.LastEventAt)
	if err != nil && err != pgx.ErrNoRows {
		return fmt.Errorf("status: last event: %w", err)
	}
	if in.LastEventAt != nil {
		in.EventAgeSeconds = since(now, *in.LastEventAt)
	}
	// The partial index events_unprocessed_project_idx serves both.
	if err := tx.QueryRow(ctx, `WITH p AS (SELECT count(*) AS n, min(id) AS first FROM events WHERE processed_at IS NULL
			AND (deferred_from IS NULL OR not_before IS NULL OR not_before <= now()))
		SELECT p.n, e.received_at FROM p LEFT JOIN events e ON e.id = p.first`).Scan(&in.PendingEvents, &in.OldestPendingAt); err != nil {
		return fmt.Errorf("status: pending events: %w", err)
	}
	if in.OldestPendingAt != nil {
		in.OldestPendingAgeSeconds = since(now, *in.OldestPendingAt)
	}
	if err := tx.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - received_at)::float8)
		FROM (SELECT processed_at, received_at FROM events WHERE processed_at IS NOT NULL AND deferred_from IS NULL ORDER BY id DESC LIMIT $1) r`, lagSample).
		Scan(&in.ProcessingLagSeconds); err != nil {
		return fmt.Errorf("status: processing lag: %w", err)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE received_at > now() - interval '24 hours'`).
		Scan(&in.DeadLetters24h); err != nil {
		return fmt.Errorf("status: dead letters: %w", err)
	}
	return nil
}

func readHosts(ctx context.Context, tx pgx.Tx, now time.Time, staleAge time.Duration) ([]HostStatus, error) {
	// Only the GPU fields shown leave the database: a report also lists
	// every vGPU type and active vGPU, ten times the bytes.
	rows, err := tx.Query(ctx, `SELECT h.name, coalesce(h.node,''), coalesce(h.agent_version,''), coalesce(h.driver_version,''),
			h.last_report_at, h.report_errors,
			(SELECT jsonb_agg(jsonb_build_object('pci', g->'pci', 'name', g->'name', 'health', g->'health',
					'util_percent', g->'util_percent', 'memory_used_mib', g->'memory_used_mib', 'memory_total_mib', g->'memory_total_mib',
					'temperature_c', g->'temperature_c', 'vendor_vfio', g->'vendor_vfio') ORDER BY g->>'pci')
				FROM jsonb_array_elements(CASE WHEN jsonb_typeof(h.report->'gpus') = 'array' THEN h.report->'gpus' ELSE '[]' END) g
				WHERE jsonb_typeof(g) = 'object')
		FROM hosts h ORDER BY h.name`)
	if err != nil {
		return nil, fmt.Errorf("status: hosts: %w", err)
	}
	defer rows.Close()
	out := []HostStatus{}
	for rows.Next() {
		var x HostStatus
		var errs, gpus []byte
		if err := rows.Scan(&x.Name, &x.Node, &x.AgentVersion, &x.DriverVersion, &x.LastReportAt, &errs, &gpus); err != nil {
			return nil, fmt.Errorf("status: hosts: %w", err)
		}
		x.Errors, x.GPUs = []string{}, []GPUHealth{}
		if len(errs) > 0 {
			if err := json.Unmarshal(errs, &x.Errors); err != nil || x.Errors == nil {
				x.Errors = []string{}
			}
		}
		if len(gpus) > 0 {
			// A report the bridge kept is well formed; a GPU field of
			// another type is shown as no GPU rather than failing the page.
			if err := json.Unmarshal(gpus, &x.GPUs); err != nil || x.GPUs == nil {
				x.GPUs = []GPUHealth{}
			}
		}
		if x.LastReportAt != nil {
			x.ReportAgeSeconds = since(now, *x.LastReportAt)
			x.Stale = staleAge > 0 && now.Sub(*x.LastReportAt) > staleAge
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("status: hosts: %w", err)
	}
	return out, nil
}

func since(now, t time.Time) *float64 {
	s := now.Sub(t).Seconds()
	if s < 0 {
		s = 0
	}
	return &s
}
