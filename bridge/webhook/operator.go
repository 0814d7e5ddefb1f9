package webhook

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// OperatorSource is the source of the requests made with operator API
// credentials (POST /v1/requests): the requests and their inbox events
// carry "webhook:api", and no webhook source may be named so.
const OperatorSource = "api"

//go:embed operator.json
var operatorFragment []byte

// RegisterOperator adds POST /v1/requests to the operator API: a request
// made with API credentials instead of a webhook secret. The body is the
// native webhook body; an admin may ask for any instance, a member
// (a project-scoped Keystone token with one of [keystone] member_roles,
// or a token line "TOKEN member NAME PROJECT") for its project's
// instances only (access rule vgpu:requests:create). Idempotency-Key works as on webhooks, in a key space of
// the caller's own.
func (e *Endpoint) RegisterOperator(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/requests", api.Project, e.operatorRequest)
	srv.Describe(operatorFragment)
	// Its body and answer are the webhook's: the same schemas, which the
	// operator API lacks when webhooks listen elsewhere.
	srv.Describe(schemasOf(openapiFragment, "WebhookNative", "WebhookAccepted"))
}

// schemasOf is a fragment with only the named component schemas of frag.
func schemasOf(frag []byte, names ...string) []byte {
	var doc struct {
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(frag, &doc); err != nil {
		panic(fmt.Sprintf("webhook: bad OpenAPI fragment: %v", err))
	}
	out := map[string]json.RawMessage{}
	for _, n := range names {
		if doc.Components.Schemas[n] == nil {
			panic("webhook: no schema " + n + " in the OpenAPI fragment")
		}
		out[n] = doc.Components.Schemas[n]
	}
	b, _ := json.Marshal(map[string]any{"components": map[string]any{"schemas": out}})
	return b
}

func (e *Endpoint) operatorRequest(c echo.Context) error {
	// The route's access rule (vgpu:requests:create: admin or a project
	// member by default) let the caller in; whoever is not admin asks for
	// its own project's instances only, checked below.
	who := api.PrincipalFrom(c)
	if who.Role != api.RoleAdmin && who.Project == "" {
		// A fleet reader or a system token an override let in: it has no
		// project to be limited to (and instances without one must not
		// count as its).
		return &api.ProblemDetails{Status: http.StatusForbidden, Title: "Forbidden", Code: "project_not_allowed",
			Detail: "only an admin may ask for changes without a project-scoped token"}
	}
	r := c.Request()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r.Body); err != nil { // bounded by the API's body limit
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return api.Problem(http.StatusRequestEntityTooLarge, "Request Entity Too Large",
				fmt.Sprintf("the body may hold at most %d bytes", mbe.Limit))
		}
		return api.Problem(http.StatusBadRequest, "Bad Request", "the body could not be read")
	}
	body := buf.Bytes()
	now := e.cfg.Now()
	// One source per caller, by its id (names may repeat across Keystone
	// domains): its idempotency keys are its own; its events say "api",
	// whoever asked.
	src := &source{cfg: Source{Name: OperatorSource + ":" + who.Key(), Format: FormatNative,
		TimestampTolerance: 5 * time.Minute}, label: requests.WebhookSourcePrefix + OperatorSource, event: OperatorSource}
	p, bad := e.build(src, body, now)
	key := r.Header.Get(HeaderIdempotencyKey)
	if key != "" && !validKey(key) {
		bad = append(bad, api.InvalidParam{Name: HeaderIdempotencyKey, Reason: "must be 1 to 255 printable ASCII characters"})
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	if who.Role != api.RoleAdmin {
		refusal, err := e.scopeTo(r.Context(), []string{who.Project}, FormatNative, p)
		if err != nil {
			e.log.Error("requests: cannot read the instance's project", logkey.Err, err)
			return scopeUnavailable(err)
		}
		if refusal != "" {
			return &api.ProblemDetails{Status: http.StatusForbidden, Title: "Forbidden", Code: "project_not_allowed",
				Detail: fmt.Sprintf("instance %s is not in project %s (or the bridge does not know it yet)", p.events[0].vm, who.Project)}
		}
	}
	if prob := e.limitProjects(r.Context(), p); prob != nil {
		return prob
	}
	p.key = cmp.Or(key, p.eventID)
	p.hash = sha256.Sum256(body)
	res := e.commit(r.Context(), p)
	if res.err != nil {
		e.log.Error("requests: commit failed", logkey.Err, res.err)
	}
	if prob := e.commitRefusal(res); prob != nil {
		return prob
	}
	if res.replay {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	} else {
		e.log.Info("request made through the API", logkey.Principal, who.Name, "request_id", p.req.ID.String())
	}
	return c.JSONBlob(res.status, res.body)
}
