package controls

import (
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls/controlswire"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

//go:embed openapi.json
var openAPI []byte

// MaxReasonBytes bounds the reason of a change.
const MaxReasonBytes = 1024

// Replayer runs a dead letter's body through ingest again (*ingest.Consumer).
type Replayer interface {
	Source() string
	Replay(ctx context.Context, raw []byte) (ingest.ReplayResult, error)
}

// API serves the operator controls:
//
//	GET|POST /v1/controls, POST|DELETE /v1/hosts/{name}/drain,
//	POST|DELETE /v1/gpus/{id}/drain, GET /v1/audit, GET /v1/profiles,
//	POST /v1/dead-letters/{id}/replay
type API struct {
	Store *Store
	// Catalog lists the vGPU profiles (policy's catalog).
	Catalog interface{ Profiles() []catalog.Profile }
	// GPUs lists the fleet's GPUs (placement index) for per-profile counts;
	// nil: no counts.
	GPUs func() []engine.GPU
	// IsNovaVF reports whether a GPU class is that of Nova-owned VF GPUs
	// ([placement] nova_vf_resource_classes); nil: none is.
	IsNovaVF func(class string) bool
	// KnownHost reports whether a name the hosts table lacks is a node of
	// the Placement mirror (drain before its agent first reports).
	KnownHost func(name string) bool
	// KnownGPU finds a GPU the gpus table lacks (a mixed bridge-owned
	// GPU) so that it can be drained.
	KnownGPU GPUKnower
	// Replayer, nil: replay answers 501.
	Replayer Replayer
	// Changed is called after a drain changed on this replica (the other
	// replicas learn through NOTIFY): refresh placement exclusions now.
	Changed func(ctx context.Context)
}

// Register adds the routes and their OpenAPI description to srv.
func (a *API) Register(srv *api.Server) {
	srv.Handle(http.MethodGet, "/v1/controls", api.Fleet, a.getControls)
	srv.Handle(http.MethodPost, "/v1/controls", api.Admin, a.setControls)
	srv.Handle(http.MethodPost, "/v1/hosts/:name/drain", api.Admin, a.drainHost(true))
	srv.Handle(http.MethodDelete, "/v1/hosts/:name/drain", api.Admin, a.drainHost(false))
	srv.Handle(http.MethodPost, "/v1/gpus/:id/drain", api.Admin, a.drainGPU(true))
	srv.Handle(http.MethodDelete, "/v1/gpus/:id/drain", api.Admin, a.drainGPU(false))
	srv.Handle(http.MethodGet, "/v1/audit", api.Fleet, a.listAudit)
	srv.Handle(http.MethodGet, "/v1/profiles", api.Project, a.profiles)
	srv.Handle(http.MethodPost, "/v1/dead-letters/:id/replay", api.Admin, a.replay)
	srv.Describe(openAPI)
}

func actor(c echo.Context) Actor {
	who := Actor{Name: "anonymous", RequestID: api.RequestID(c)}
	if p := api.PrincipalFrom(c); p != nil && p.Name != "" {
		who.Name = p.Name
	}
	return who
}

// ControlsAnswer is the answer of GET and POST /v1/controls.
type ControlsAnswer struct {
	Mode
	Changed bool `json:"changed"`
}

func (a *API) getControls(c echo.Context) error {
	m, err := a.Store.Get(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ControlsAnswer{Mode: m})
}

// reasonBody is the body of the drain routes and part of /v1/controls.
type reasonBody struct {
	Reason string `json:"reason"`
}

func checkReason(reason string, required bool) []api.InvalidParam {
	switch {
	case required && strings.TrimSpace(reason) == "":
		return []api.InvalidParam{{Name: "reason", Reason: "say why (it is audited), e.g. \"maintenance window CHG-1234\""}}
	case len(reason) > MaxReasonBytes:
		return []api.InvalidParam{{Name: "reason", Reason: "at most " + strconv.Itoa(MaxReasonBytes) + " bytes"}}
	}
	return nil
}

func (a *API) setControls(c echo.Context) error {
	var ch Change
	if err := api.DecodeJSON(c, &ch); err != nil {
		return err
	}
	bad := checkReason(ch.Reason, true)
	if ch.Paused == nil && ch.ObserveOnly == nil {
		bad = append(bad, api.InvalidParam{Name: "paused", Reason: "give paused and/or observe_only (true or false)"})
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	before, after, err := a.Store.Set(c.Request().Context(), actor(c), ch)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ControlsAnswer{Mode: after, Changed: before.Paused != after.Paused || before.ObserveOnly != after.ObserveOnly})
}

// readReason reads {"reason": …} from a POST body, or ?reason= (DELETE
// usually has no body).
func readReason(c echo.Context, required bool) (string, error) {
	var b reasonBody
	if c.Request().ContentLength != 0 && c.Request().Method == http.MethodPost {
		if err := api.DecodeJSON(c, &b); err != nil {
			return "", err
		}
	}
	if b.Reason == "" {
		b.Reason = c.QueryParam("reason")
	}
	if bad := checkReason(b.Reason, required); len(bad) > 0 {
		return "", api.ValidationProblem(bad)
	}
	return b.Reason, nil
}

func (a *API) drainHost(drain bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		reason, err := readReason(c, drain)
		if err != nil {
			return err
		}
		name := c.Param("name")
		h, err := a.Store.DrainHost(c.Request().Context(), actor(c), name, reason, drain, a.KnownHost)
		if errors.Is(err, ErrNotFound) {
			return api.Problem(http.StatusNotFound, "Host not found",
				"no host or node named "+name+" is known (from agents' reports, Nova's services or the Placement mirror)")
		}
		if err != nil {
			return err
		}
		if h.Changed && a.Changed != nil {
			a.Changed(c.Request().Context())
		}
		return c.JSON(http.StatusOK, h)
	}
}

func (a *API) drainGPU(drain bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		reason, err := readReason(c, drain)
		if err != nil {
			return err
		}
		id := c.Param("id")
		g, err := a.Store.DrainGPU(c.Request().Context(), actor(c), id, reason, drain, a.KnownGPU)
		if errors.Is(err, ErrNotFound) {
			return api.Problem(http.StatusNotFound, "GPU not found", "no GPU has provider UUID "+id+" (see GET /v1/gpus)")
		}
		if err != nil {
			return err
		}
		if g.Changed && a.Changed != nil {
			a.Changed(c.Request().Context())
		}
		return c.JSON(http.StatusOK, g)
	}
}

// AuditRecord is one audit_log row as the API answers it.
type AuditRecord = controlswire.AuditRecord

// AuditList is a page of audit records, oldest first.
type AuditList struct {
	Records    []*AuditRecord `json:"audit"`
	NextCursor string         `json:"next_cursor,omitempty"`
}

const (
	defaultLimit = 100
	maxLimit     = 1000
)

func (a *API) listAudit(c echo.Context) error {
	var bad []api.InvalidParam
	limit := defaultLimit
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			bad = append(bad, api.InvalidParam{Name: "limit", Reason: "an integer from 1 to " + strconv.Itoa(maxLimit)})
		}
		limit = n
	}
	var afterID int64
	if s := c.QueryParam("cursor"); s != "" {
		n, ok := decodeCursor(s)
		if !ok {
			bad = append(bad, api.InvalidParam{Name: "cursor", Reason: "not a cursor from a previous answer's next_cursor"})
		}
		afterID = n
	}
	var since *time.Time
	if s := c.QueryParam("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "since", Reason: "an RFC 3339 time, e.g. 2024-05-01T12:00:00Z"})
		}
		since = &t
	}
	// object is type/id ("host/cmp1") or a bare id.
	objType, objID := "", c.QueryParam("object")
	if t, id, ok := strings.Cut(objID, "/"); ok {
		objType, objID = t, id
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	// action matches exactly, or as a prefix when it ends with '*' (host.*).
	action, prefix := c.QueryParam("action"), false
	if action == "" {
		action = c.QueryParam("kind")
	}
	if strings.HasSuffix(action, "*") {
		action, prefix = strings.TrimSuffix(action, "*"), true
	}
	rows, err := a.Store.pool.Query(c.Request().Context(), `SELECT id, at, actor, action, object_type, object_id, request_id,
			global_request_id, detail FROM audit_log
		WHERE id > $1 AND ($2::timestamptz IS NULL OR at >= $2) AND ($3 = '' OR actor = $3)
		AND ($4 = '' OR (NOT $5 AND action = $4) OR ($5 AND starts_with(action, $4)))
		AND ($6 = '' OR object_type = $6) AND ($7 = '' OR object_id = $7)
		AND ($8 = '' OR request_id = $8 OR global_request_id = $8)
		ORDER BY id LIMIT $9`,
		afterID, since, c.QueryParam("actor"), action, prefix, objType, objID, c.QueryParam("request_id"), limit+1)
	if err != nil {
		return err
	}
	out := AuditList{Records: []*AuditRecord{}}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*AuditRecord, error) {
		var x AuditRecord
		err := r.Scan(&x.ID, &x.At, &x.Actor, &x.Action, &x.ObjectType, &x.ObjectID, &x.RequestID, &x.GlobalRequestID, &x.Detail)
		if len(x.Detail) == 0 {
			x.Detail = json.RawMessage("null")
		}
		return &x, err
	})
	if err != nil {
		return err
	}
	out.Records = append(out.Records, recs...)
	if len(out.Records) > limit {
		out.Records = out.Records[:limit]
		out.NextCursor = encodeCursor(out.Records[limit-1].ID)
	}
	return c.JSON(http.StatusOK, out)
}

// The cursor has /v1/events' form: base64url of {"k": "<last id>"}.
func encodeCursor(id int64) string {
	b, _ := json.Marshal(map[string]string{"k": strconv.FormatInt(id, 10)})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (int64, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return 0, false
	}
	var cur struct {
		K string `json:"k"`
	}
	if json.Unmarshal(b, &cur) != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(cur.K, 10, 64)
	return n, err == nil && n >= 0
}

// ProfileRecord is one profile of GET /v1/profiles with the fleet's
// counts of GPUs typed for it.
type ProfileRecord struct {
	catalog.Profile
	GPUs int `json:"gpus"`
	// BridgeOwnedGPUs are, of GPUs, those of the bridge's own resource
	// class (placement.BridgeClass): Nova's vGPU flavors never reach them.
	BridgeOwnedGPUs int `json:"bridge_owned_gpus,omitempty"`
	// NovaVFGPUs are, of GPUs, Nova-owned VF GPUs (Nova's PCI providers):
	// a server gets one through a flavor's pci_passthrough:alias, not
	// resources:VGPU.
	NovaVFGPUs int `json:"nova_vf_gpus,omitempty"`
	Capacity   int `json:"capacity"`
	Used       int `json:"used"`
	Free       int `json:"free"`
}

func (a *API) profiles(c echo.Context) error {
	type count struct{ gpus, bridge, novaVF, capacity, used, free int }
	counts := map[string]*count{}
	if a.GPUs != nil {
		for _, g := range a.GPUs() {
			if len(g.Types) != 1 {
				continue
			}
			x := counts[g.Types[0]]
			if x == nil {
				x = &count{}
				counts[g.Types[0]] = x
			}
			x.gpus++
			if g.Class == placement.BridgeClass {
				x.bridge++
			}
			if a.IsNovaVF != nil && a.IsNovaVF(g.Class) {
				x.novaVF++
			}
			x.capacity += g.Capacity()
			x.used += g.Used
			x.free += g.Free()
		}
	}
	series := c.QueryParam("series")
	gpu := c.QueryParam("gpu")
	out := []ProfileRecord{}
	if a.Catalog != nil {
		for _, p := range a.Catalog.Profiles() {
			if (series != "" && string(p.Series) != series) || (gpu != "" && p.GPU != gpu) {
				continue
			}
			r := ProfileRecord{Profile: p}
			if x := counts[p.Trait]; p.Trait != "" && x != nil {
				r.GPUs, r.BridgeOwnedGPUs, r.NovaVFGPUs, r.Capacity, r.Used, r.Free = x.gpus, x.bridge, x.novaVF, x.capacity, x.used, x.free
			}
			out = append(out, r)
		}
	}
	return c.JSON(http.StatusOK, map[string]any{"profiles": out})
}
