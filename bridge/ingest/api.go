package ingest

import (
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest/ingestwire"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

//go:embed openapi.json
var openAPI []byte

// Page sizes of the list routes.
const (
	defaultLimit = 100
	maxLimit     = 1000
)

// API serves the instance, event and dead-letter routes over the state the
// consumer keeps.
type API struct{ pool *pgxpool.Pool }

// NewAPI returns the routes' handlers over pool.
func NewAPI(pool *pgxpool.Pool) *API { return &API{pool: pool} }

// Register adds the routes and their OpenAPI description to srv.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodGet, "/v1/instances/:uuid", api.Project, a.getInstance)
	srv.Handle(http.MethodGet, "/v1/instances", api.Project, a.listInstances)
	srv.Handle(http.MethodGet, "/v1/events", api.Project, a.listEvents)
	srv.Handle(http.MethodGet, "/v1/dead-letters", api.Admin, a.listDeadLetters)
	srv.Describe(openAPI)
}

// Register adds the API routes over the consumer's database.
func (c *Consumer) Register(srv *api.Server) { NewAPI(c.pool).Register(srv) }

// Instance is an instance as the API answers it.
type Instance = ingestwire.Instance

const instanceCols = `uuid::text, project_id, user_id, host, node, display_name, availability_zone, vm_state, task_state,
	power_state, flavor, new_flavor, vgpu_demand, vgpus, fault, last_event_type, last_event_at, deleted_at, created_at, updated_at`

func scanInstance(row pgx.Row) (*Instance, error) {
	var in Instance
	err := row.Scan(&in.UUID, &in.ProjectID, &in.UserID, &in.Host, &in.Node, &in.DisplayName, &in.AvailabilityZone,
		&in.VMState, &in.TaskState, &in.PowerState, &in.Flavor, &in.NewFlavor, &in.VGPUDemand, &in.VGPUs, &in.Fault,
		&in.LastEventType, &in.LastEventAt, &in.DeletedAt, &in.CreatedAt, &in.UpdatedAt)
	in.HasVGPU = in.VGPUs > 0
	for _, f := range []*json.RawMessage{&in.Flavor, &in.NewFlavor, &in.VGPUDemand, &in.Fault} {
		if len(*f) == 0 {
			*f = json.RawMessage("null")
		}
	}
	return &in, err
}

// scope returns the project the caller is limited to ("" for all).
func scope(c echo.Context) string {
	if p := api.PrincipalFrom(c); p != nil {
		return p.Project
	}
	return ""
}

func (a *API) getInstance(c echo.Context) error {
	id := c.Param("uuid")
	if !nova.IsUUID(id) {
		return api.ValidationProblem([]api.InvalidParam{{Name: "uuid", Reason: "not a UUID"}})
	}
	in, err := scanInstance(a.pool.QueryRow(c.Request().Context(),
		`SELECT `+instanceCols+` FROM instances WHERE uuid = $1 AND ($2 = '' OR project_id = $2)`, id, scope(c)))
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Problem(http.StatusNotFound, "Instance not found", "no notification about instance "+id+" has been received")
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, in)
}

// cursor is the opaque pagination token: the last key of a page.
type cursor struct {
	K string `json:"k"`
}

func encodeCursor(k string) string {
	b, _ := json.Marshal(cursor{K: k})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (string, bool) {
	if s == "" {
		return "", true
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", false
	}
	var cur cursor
	if json.Unmarshal(b, &cur) != nil || cur.K == "" {
		return "", false
	}
	return cur.K, true
}

// pageParams reads limit and cursor, collecting invalid fields.
func pageParams(c echo.Context, bad *[]api.InvalidParam) (limit int, after string) {
	limit = defaultLimit
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			*bad = append(*bad, api.InvalidParam{Name: "limit", Reason: "an integer from 1 to " + strconv.Itoa(maxLimit)})
		}
		limit = n
	}
	after, ok := decodeCursor(c.QueryParam("cursor"))
	if !ok {
		*bad = append(*bad, api.InvalidParam{Name: "cursor", Reason: "not a cursor from a previous answer's next_cursor"})
	}
	return limit, after
}

// InstanceList is a page of instances.
type InstanceList struct {
	Instances  []*Instance `json:"instances"`
	NextCursor string      `json:"next_cursor,omitempty"`
}

func (a *API) listInstances(c echo.Context) error {
	var bad []api.InvalidParam
	limit, after := pageParams(c, &bad)
	if after != "" && !nova.IsUUID(after) {
		bad = append(bad, api.InvalidParam{Name: "cursor", Reason: "not a cursor from a previous answer's next_cursor"})
	}
	var hasVGPU *bool
	if s := c.QueryParam("has_vgpu"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "has_vgpu", Reason: "true or false"})
		}
		hasVGPU = &b
	}
	deleted := false
	if s := c.QueryParam("deleted"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "deleted", Reason: "true or false"})
		}
		deleted = b
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	project := c.QueryParam("project")
	if s := scope(c); s != "" {
		if project != "" && project != s {
			return c.JSON(http.StatusOK, InstanceList{Instances: []*Instance{}})
		}
		project = s
	}
	q := `SELECT ` + instanceCols + ` FROM instances
		WHERE ($1 = '' OR host = $1) AND ($2 = '' OR project_id = $2)
		AND ($3::bool IS NULL OR (vgpus > 0) = $3::bool)
		AND ($4::bool OR deleted_at IS NULL)
		AND ($5::uuid IS NULL OR uuid > $5::uuid)
		ORDER BY uuid LIMIT $6`
	rows, err := a.pool.Query(c.Request().Context(), q, c.QueryParam("host"), project, hasVGPU, deleted, nilIfEmpty(after), limit+1)
	if err != nil {
		return err
	}
	defer rows.Close()
	out := InstanceList{Instances: []*Instance{}}
	for rows.Next() {
		in, err := scanInstance(rows)
		if err != nil {
			return err
		}
		out.Instances = append(out.Instances, in)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(out.Instances) > limit {
		out.Instances = out.Instances[:limit]
		out.NextCursor = encodeCursor(out.Instances[limit-1].UUID)
	}
	return c.JSON(http.StatusOK, out)
}

// EventRecord is an inbox row as the API answers it.
type EventRecord = ingestwire.EventRecord

// EventList is a page of events, oldest first.
type EventList struct {
	Events     []*EventRecord `json:"events"`
	NextCursor string         `json:"next_cursor,omitempty"`
}

func (a *API) listEvents(c echo.Context) error {
	var bad []api.InvalidParam
	limit, after := pageParams(c, &bad)
	var afterID int64
	if after != "" {
		n, err := strconv.ParseInt(after, 10, 64)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "cursor", Reason: "not a cursor from a previous answer's next_cursor"})
		}
		afterID = n
	}
	inst := c.QueryParam("instance")
	if inst != "" && !nova.IsUUID(inst) {
		bad = append(bad, api.InvalidParam{Name: "instance", Reason: "not a UUID"})
	}
	var since *time.Time
	if s := c.QueryParam("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "since", Reason: "an RFC 3339 time, e.g. 2024-05-01T12:00:00Z"})
		}
		since = &t
	}
	withPayload := false
	if s := c.QueryParam("payload"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "payload", Reason: "true or false"})
		}
		withPayload = b
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	// type matches exactly, or as a prefix when it ends with '*'
	// (instance.resize*).
	typ, prefix := c.QueryParam("type"), false
	if strings.HasSuffix(typ, "*") {
		typ, prefix = strings.TrimSuffix(typ, "*"), true
	}
	payloadCol := "NULL::json"
	if withPayload {
		payloadCol = "payload"
	}
	q := `SELECT id, source, message_id, event_type, instance_uuid::text, publisher_id, priority, request_id,
			global_request_id, occurred_at, received_at, processed_at, status, detail, ` + payloadCol + `
		FROM events
		WHERE id > $1 AND ($2::uuid IS NULL OR instance_uuid = $2::uuid)
		AND ($3 = '' OR (NOT $4 AND event_type = $3) OR ($4 AND starts_with(event_type, $3)))
		AND ($5::timestamptz IS NULL OR occurred_at >= $5)
		AND ($6 = '' OR instance_uuid IN (SELECT uuid FROM instances WHERE project_id = $6))
		ORDER BY id LIMIT $7`
	rows, err := a.pool.Query(c.Request().Context(), q, afterID, nilIfEmpty(inst), typ, prefix, since, scope(c), limit+1)
	if err != nil {
		return err
	}
	defer rows.Close()
	out := EventList{Events: []*EventRecord{}}
	for rows.Next() {
		var e EventRecord
		if err := rows.Scan(&e.ID, &e.Source, &e.MessageID, &e.EventType, &e.InstanceUUID, &e.PublisherID, &e.Priority,
			&e.RequestID, &e.GlobalRequestID, &e.OccurredAt, &e.ReceivedAt, &e.ProcessedAt, &e.Status, &e.Detail, &e.Payload); err != nil {
			return err
		}
		out.Events = append(out.Events, &e)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(out.Events) > limit {
		out.Events = out.Events[:limit]
		out.NextCursor = encodeCursor(strconv.FormatInt(out.Events[limit-1].ID, 10))
	}
	return c.JSON(http.StatusOK, out)
}

// DeadLetter is a dead letter as the API answers it. Raw is the (capped)
// body as text, or base64 when it is not UTF-8 (RawEncoding "base64").
type DeadLetter = ingestwire.DeadLetter

// DeadLetterList is a page of dead letters, newest first.
type DeadLetterList struct {
	DeadLetters []*DeadLetter `json:"dead_letters"`
	NextCursor  string        `json:"next_cursor,omitempty"`
}

func (a *API) listDeadLetters(c echo.Context) error {
	var bad []api.InvalidParam
	limit, after := pageParams(c, &bad)
	var beforeID int64
	if after != "" {
		n, err := strconv.ParseInt(after, 10, 64)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "cursor", Reason: "not a cursor from a previous answer's next_cursor"})
		}
		beforeID = n
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	rows, err := a.pool.Query(c.Request().Context(), `SELECT id, source, reason, detail, message_id, raw, raw_truncated,
			headers, received_at FROM dead_letters
		WHERE ($1 = 0 OR id < $1) AND ($2 = '' OR reason = $2) AND ($3 = '' OR source = $3)
		ORDER BY id DESC LIMIT $4`, beforeID, c.QueryParam("reason"), c.QueryParam("source"), limit+1)
	if err != nil {
		return err
	}
	defer rows.Close()
	out := DeadLetterList{DeadLetters: []*DeadLetter{}}
	for rows.Next() {
		var d DeadLetter
		var raw []byte
		if err := rows.Scan(&d.ID, &d.Source, &d.Reason, &d.Detail, &d.MessageID, &raw, &d.RawTruncated, &d.Headers, &d.ReceivedAt); err != nil {
			return err
		}
		if utf8.Valid(raw) {
			d.Raw, d.RawEncoding = string(raw), "text"
		} else {
			d.Raw, d.RawEncoding = base64.StdEncoding.EncodeToString(raw), "base64"
		}
		if len(d.Headers) == 0 {
			d.Headers = json.RawMessage("null")
		}
		out.DeadLetters = append(out.DeadLetters, &d)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(out.DeadLetters) > limit {
		out.DeadLetters = out.DeadLetters[:limit]
		out.NextCursor = encodeCursor(strconv.FormatInt(out.DeadLetters[limit-1].ID, 10))
	}
	return c.JSON(http.StatusOK, out)
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
