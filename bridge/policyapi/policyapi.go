// Package policyapi serves POST /v1/policy/explain: the decision the active
// policy takes for an event, with the state given in the request or, when
// none is given, the bridge's live state.
package policyapi

import (
	_ "embed"
	"encoding/json"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
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
}

// Handlers serve the policy routes.
type Handlers struct {
	cfg Config
}

// New returns the handlers.
func New(cfg Config) *Handlers { return &Handlers{cfg: cfg} }

// Register adds the routes and their OpenAPI description to srv.
func (h *Handlers) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/policy/explain", api.Fleet, h.explain)
	srv.Describe(openAPI)
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
