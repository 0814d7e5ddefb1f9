package requests

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

//go:embed openapi.json
var openapiFragment []byte

// OpenAPI returns the OpenAPI fragment of the request routes.
func OpenAPI() []byte { return openapiFragment }

// SourceAuthenticator checks that an HTTP request carries the credentials
// of a webhook source; package webhook implements it.
type SourceAuthenticator interface {
	// AuthenticateSource returns, when scoped, the projects the
	// credentials are limited to (a jwt source's token naming its
	// projects): they read only the source's requests about instances of
	// those projects.
	AuthenticateSource(r *http.Request, source string) (projects []string, scoped bool, err error)
}

// Handler serves the request routes.
type Handler struct {
	store    *Store
	operator api.Authenticator
	sources  SourceAuthenticator
	log      *slog.Logger
	// canceller ends cancelled requests whose vGPUs are in flight (SetCanceller); nil: Cancel.
	canceller atomic.Pointer[Canceller]
}

// Canceller cancels a request at an operator's word where compensation
// may be due (direct.Path.Cancel): the request reads final only once the
// claims it gives back are made. It answers ErrNotFound for no such
// request and ErrIllegal for one that is final, or ending already.
type Canceller interface {
	Cancel(ctx context.Context, id uuid.UUID, actor string) error
}

// SetCanceller makes POST /v1/requests/{id}/cancel go through c (the
// pipeline is wired after the routes); until then a cancel ends the
// request at once (Store.Cancel) and what it had in flight is
// compensated after.
func (h *Handler) SetCanceller(c Canceller) { h.canceller.Store(&c) }

// NewHandler returns the routes over store. operator authenticates operator
// API callers (the [api] auth strategy); sources, when not nil, lets a
// webhook source read its own requests with its own credentials.
func NewHandler(store *Store, operator api.Authenticator, sources SourceAuthenticator, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if operator == nil {
		operator = api.NoAuth{}
	}
	return &Handler{store: store, operator: operator, sources: sources, log: log}
}

// Register adds GET /v1/requests, GET /v1/requests/{id} and
// POST /v1/requests/{id}/cancel to srv and describes them.
func (h *Handler) Register(srv *api.Server) {
	srv.Handle(http.MethodGet, "/v1/requests", api.Project, h.list)
	h.RegisterStatus(srv)
	srv.Handle(http.MethodPost, "/v1/requests/:id/cancel", api.Admin, h.cancel)
	srv.Describe(openapiFragment)
}

// RegisterStatus adds only GET /v1/requests/{id}, for a webhook listener
// apart from the API (its description comes with Register on the API).
func (h *Handler) RegisterStatus(srv *api.Server) {
	srv.Handle(http.MethodGet, "/v1/requests/:id", api.Custom, h.get)
}

// RuleGet is the access rule an operator's credentials must pass to read
// a request (a source's own credentials need not).
const RuleGet = "vgpu:requests:get"

// StatusFragment is the OpenAPI fragment of GET /v1/requests/{id} alone.
func StatusFragment() []byte { return statusFragment }

//go:embed status.json
var statusFragment []byte

func notFound(id string) error {
	return &api.ProblemDetails{Status: http.StatusNotFound, Title: "Not Found", Code: "no_such_request",
		Detail: fmt.Sprintf("no request %q", id)}
}

func (h *Handler) get(c echo.Context) error {
	raw := c.Param("id")
	id, err := uuid.Parse(raw)
	if err != nil {
		return notFound(raw)
	}
	r := c.Request()
	req, err := h.store.Get(r.Context(), id)
	if IsNotFound(err) {
		return notFound(raw)
	}
	if err != nil {
		return err
	}
	// The source's own credentials are checked first, locally: with
	// auth_strategy = keystone, a source's bearer secret must never be sent
	// to Keystone as a token to validate.
	name := SourceName(req.Source)
	isSource := h.sources != nil && name != req.Source
	var srcErr error
	if isSource {
		var projects []string
		var scoped bool
		if projects, scoped, srcErr = h.sources.AuthenticateSource(r, name); srcErr == nil {
			api.SetPrincipal(c, &api.Principal{Name: req.Source})
			if scoped {
				// One source, several tenants: a token limited to some
				// projects reads their requests only.
				ok, err := h.store.InProjects(r.Context(), req, projects)
				if err != nil {
					return err
				}
				if !ok {
					return notFound(raw)
				}
			}
			return c.JSON(http.StatusOK, req)
		}
	}
	if p, err := h.operator.Authenticate(r); err == nil && api.Authorize(c, RuleGet, p) == nil {
		api.SetPrincipal(c, p)
		if err := h.visible(c, req); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, req)
	}
	if !isSource {
		return unauthorized("operator credentials with the reader, member or admin role are needed")
	}
	h.log.Info("request status refused", "source", name, "remote", c.RealIP(), "reason", srcErr.Error())
	return unauthorized("send operator credentials, or the credentials of the source that created the request")
}

// visible answers 404, as for a request that does not exist, when the
// caller is limited to a project and req is not about one of its instances.
func (h *Handler) visible(c echo.Context, req Request) error {
	p := api.PrincipalFrom(c)
	if p == nil || p.Project == "" {
		return nil
	}
	ok, err := h.store.InProject(c.Request().Context(), req, p.Project)
	if err != nil {
		return err
	}
	if !ok {
		return notFound(req.ID.String())
	}
	return nil
}

func unauthorized(detail string) error {
	return &api.ProblemDetails{Status: http.StatusUnauthorized, Title: "Unauthorized", Code: "unauthorized", Detail: detail}
}

func (h *Handler) cancel(c echo.Context) error {
	raw := c.Param("id")
	id, err := uuid.Parse(raw)
	if err != nil {
		return notFound(raw)
	}
	actor := "operator"
	if p := api.PrincipalFrom(c); p != nil {
		actor = p.Name
	}
	if p := api.PrincipalFrom(c); p != nil && p.Project != "" {
		req, err := h.store.Get(c.Request().Context(), id)
		if IsNotFound(err) {
			return notFound(raw)
		}
		if err != nil {
			return err
		}
		if err := h.visible(c, req); err != nil {
			return err
		}
	}
	ctx := c.Request().Context()
	var out Request
	if cc := h.canceller.Load(); cc != nil {
		if err = (*cc).Cancel(ctx, id, actor); err == nil || IsIllegal(err) {
			var gerr error
			if out, gerr = h.store.Get(ctx, id); gerr != nil {
				return gerr
			}
		}
	} else {
		err = h.store.Do(ctx, func(tx pgx.Tx) error {
			var err error
			out, err = h.store.Cancel(ctx, tx, id, actor)
			return err
		})
	}
	switch {
	case IsNotFound(err):
		return notFound(raw)
	case IsIllegal(err):
		return &api.ProblemDetails{Status: http.StatusConflict, Title: "Conflict", Code: "final_state",
			Detail: fmt.Sprintf("request %s is already %s", id, orEnding(out))}
	case err != nil:
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// orEnding is the state a cancel found request r in: final, or ending
// (its end waits for the claims it gives back).
func orEnding(r Request) string {
	if r.State.Final() {
		return string(r.State)
	}
	return "ending"
}

func (h *Handler) list(c echo.Context) error {
	var o ListOptions
	var bad []api.InvalidParam
	o.Source = c.QueryParam("source")
	if s := c.QueryParam("state"); s != "" {
		o.State = State(s)
		if !o.State.Valid() {
			bad = append(bad, api.InvalidParam{Name: "state", Reason: "must be accepted, decided, dispatched, succeeded, failed or rejected"})
		}
	}
	if s := c.QueryParam("instance_uuid"); s != "" {
		u, err := uuid.Parse(s)
		if err != nil {
			bad = append(bad, api.InvalidParam{Name: "instance_uuid", Reason: "must be a UUID"})
		} else {
			o.InstanceUUID = &u
		}
	}
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			bad = append(bad, api.InvalidParam{Name: "limit", Reason: "must be an integer from 1 to 1000"})
		}
		o.Limit = n
	}
	if len(bad) > 0 {
		return api.ValidationProblem(bad)
	}
	if p := api.PrincipalFrom(c); p != nil {
		o.Project = p.Project // a project-scoped caller sees its project's requests only
	}
	rs, err := h.store.List(c.Request().Context(), o)
	if err != nil {
		return err
	}
	if rs == nil {
		rs = []Request{}
	}
	return c.JSON(http.StatusOK, map[string]any{"requests": rs})
}
