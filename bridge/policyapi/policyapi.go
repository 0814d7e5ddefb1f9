// Package policyapi serves POST /v1/policy/explain: the decision the active
// policy takes for an event, with the state given in the request or, when
// none is given, the bridge's live state; and POST /v1/policy/replay: the
// recorded events of a window run through the active policy and a
// candidate rules file, with no side effect (package policyreplay).
package policyapi

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/policyreplay"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

//go:embed openapi.json
var openAPI []byte

// Config is what the handlers read.
type Config struct {
	// Holder holds the active policy (required).
	Holder *policy.Holder
	// State returns the live state for requests that carry none; nil means
	// an empty state.
	State func() policy.State
	// Load is the live load-rule state (read only here); nil means none.
	Load policy.LoadState
	// Pool is the bridge's database, read by replays; nil: replays are
	// refused (503).
	Pool *pgxpool.Pool
	// ClockSkew is [pipeline] clock_skew_tolerance, for replays.
	ClockSkew time.Duration
	Log       *slog.Logger
}

// Handlers serve the policy routes.
type Handlers struct {
	cfg Config
	// replaying holds a token while a replay runs: one at a time.
	replaying chan struct{}
}

// New returns the handlers.
func New(cfg Config) *Handlers { return &Handlers{cfg: cfg, replaying: make(chan struct{}, 1)} }

// Register adds the routes and their OpenAPI description to srv.
func (h *Handlers) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/policy/explain", api.Fleet, h.explain)
	srv.Handle(http.MethodPost, "/v1/policy/replay", api.Admin, h.replay)
	srv.Describe(openAPI)
}

// Bounds of a replay over the API: its answer is one document of at most
// MaxReplayEvents events.
const (
	DefaultReplayEvents = 1000
	MaxReplayEvents     = 10000
)

// replayRequest is the body of POST /v1/policy/replay.
type replayRequest struct {
	Since     *time.Time `json:"since"`
	Until     *time.Time `json:"until"`
	Rules     *string    `json:"rules"`
	MaxEvents int        `json:"max_events"`
}

func (h *Handlers) replay(c echo.Context) error {
	var req replayRequest
	if err := api.DecodeJSON(c, &req); err != nil {
		return err
	}
	var bad []api.InvalidParam
	if req.Since == nil {
		bad = append(bad, api.InvalidParam{Name: "since", Reason: "is required (RFC 3339)"})
	}
	if req.Until == nil {
		bad = append(bad, api.InvalidParam{Name: "until", Reason: "is required (RFC 3339)"})
	}
	if req.Since != nil && req.Until != nil && !req.Since.Before(*req.Until) {
		bad = append(bad, api.InvalidParam{Name: "until", Reason: "must be after since"})
	}
	if req.Rules == nil || strings.TrimSpace(*req.Rules) == "" {
		bad = append(bad, api.InvalidParam{Name: "rules", Reason: "is required: the candidate rules file's text"})
	}
	if req.MaxEvents < 0 || req.MaxEvents > MaxReplayEvents {
		bad = append(bad, api.InvalidParam{Name: "max_events", Reason: fmt.Sprintf("must be 1 to %d (0: %d)", MaxReplayEvents, DefaultReplayEvents)})
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	active := h.cfg.Holder.Policy()
	cand, err := policy.Load(strings.NewReader(*req.Rules), policy.Options{Catalog: h.cfg.Holder.Catalog(), Compat: active.Compat()})
	if err != nil {
		var le *policy.LoadError
		if !errors.As(err, &le) {
			return api.ValidationProblem([]api.InvalidParam{{Name: "rules", Reason: err.Error()}})
		}
		for _, pe := range le.Errors {
			bad = append(bad, api.InvalidParam{Name: "rules", Reason: pe.Error()})
		}
		p := api.ValidationProblem(bad)
		p.Detail = fmt.Sprintf("the candidate rules do not compile: %d problem(s), each LINE:COLUMN: rule \"NAME\": message", len(bad))
		return p
	}
	if h.cfg.Pool == nil {
		return api.Problem(http.StatusServiceUnavailable, "Service Unavailable", "replays need the bridge's database")
	}
	select {
	case h.replaying <- struct{}{}:
		defer func() { <-h.replaying }()
	default:
		p := api.Problem(http.StatusTooManyRequests, "Too Many Requests", "another replay is running; one runs at a time")
		p.Headers = map[string]string{"Retry-After": "10"}
		return p
	}
	o := policyreplay.Options{Since: *req.Since, Until: *req.Until, MaxEvents: req.MaxEvents, Active: active, Candidate: cand,
		Catalog: h.cfg.Holder.Catalog(), ClockSkew: h.cfg.ClockSkew, Log: h.cfg.Log}
	if o.MaxEvents == 0 {
		o.MaxEvents = DefaultReplayEvents
	}
	// The answer starts with the first event: an error before it is a
	// problem; one after it ends the document with "error".
	w := policyreplay.NewJSONWriter(c.Response())
	started := false
	sum, err := policyreplay.Run(c.Request().Context(), h.cfg.Pool, o, func(ev policyreplay.Event) error {
		if !started {
			started = true
			c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
			c.Response().WriteHeader(http.StatusOK)
		}
		return w.Event(ev)
	})
	if err != nil && !started {
		if errors.Is(err, policyreplay.ErrInvalid) {
			return api.ValidationProblem([]api.InvalidParam{{Name: "since", Reason: err.Error()}})
		}
		if h.cfg.Log != nil {
			h.cfg.Log.Error("policy replay failed", "error", err.Error())
		}
		return api.Problem(http.StatusServiceUnavailable, "Service Unavailable", "the replay could not read the recorded events: "+err.Error())
	}
	if !started {
		c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
		c.Response().WriteHeader(http.StatusOK)
	}
	return w.Close(sum, err)
}

// explainRequest is the body; Event is required.
type explainRequest struct {
	Event *policy.Event    `json:"event"`
	State *policy.MemState `json:"state,omitempty"`
}

// explainResponse is the decision plus its text rendering.
type explainResponse struct {
	*policy.Decision
	Text string `json:"text"`
}

func (h *Handlers) explain(c echo.Context) error {
	var req explainRequest
	if err := api.DecodeJSON(c, &req); err != nil {
		return err
	}
	if req.Event == nil {
		return api.ValidationProblem([]api.InvalidParam{{Name: "event", Reason: "is required"}})
	}
	if req.Event.Kind == "" {
		return api.ValidationProblem([]api.InvalidParam{{Name: "event.kind", Reason: "is required, e.g. webhook.GPU_REQUEST"}})
	}
	p := h.cfg.Holder.Policy()
	var st policy.State
	switch {
	case req.State != nil:
		st = req.State
	case h.cfg.State != nil:
		st = h.cfg.State()
	}
	// Evaluate is pure: the load updates it returns are not applied, so
	// explaining never changes what load rules remember.
	d := p.Evaluate(*req.Event, st, h.cfg.Load)
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(http.StatusOK)
	enc := json.NewEncoder(c.Response())
	enc.SetEscapeHTML(false)
	return enc.Encode(explainResponse{Decision: d, Text: d.Explain()})
}
