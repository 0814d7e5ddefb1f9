// Package api is the bridge's HTTP server: the operator API under /v1,
// health and readiness, Prometheus metrics and the OpenAPI document.
// Features register their routes and describe them in OpenAPI fragments.
package api

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// Config configures a Server.
type Config struct {
	Listen            string // host:port
	TLSConfig         *tls.Config
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	// MaxBodyBytes bounds request bodies of routes that do not read them
	// themselves.
	MaxBodyBytes  int64
	ShutdownGrace time.Duration
	// DisableByFile is [healthcheck] disable_by_file_path: while it
	// exists, /healthcheck answers 503.
	DisableByFile string
	Auth          Authenticator
	// Policy holds the access rules; nil: DefaultPolicy.
	Policy   *Policy
	Registry *prometheus.Registry
	Logger   *slog.Logger
	Version  string
}

// Checker reports whether a dependency is usable; nil means ready.
type Checker func(ctx context.Context) error

// Server is the bridge's HTTP server.
type Server struct {
	cfg    Config
	e      *echo.Echo
	log    *slog.Logger
	auth   Authenticator
	policy *Policy
	reg    *prometheus.Registry
	http   *http.Server
	lnMu   sync.Mutex
	ln     net.Listener
	ready  chan struct{}
	checks []namedCheck

	docMu  sync.Mutex
	doc    map[string]any
	access map[string]Access // "method /openapi/{path}" → class (Handle)
	rules  map[string]string // "method /openapi/{path}" → access rule (Handle)

	reqs *prometheus.HistogramVec

	// qp: each described route's query parameters (input.go), read from
	// the document at the first request that has a query.
	qpMu sync.Mutex
	qp   map[string]map[string]bool
}

type namedCheck struct {
	name string
	fn   Checker
}

// New builds a server with the health, readiness, metrics and OpenAPI routes.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Auth == nil {
		cfg.Auth = NoAuth{}
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Policy == nil {
		cfg.Policy = DefaultPolicy()
	}
	cfg.withDefaults()
	s := &Server{cfg: cfg, e: echo.New(), log: cfg.Logger, auth: cfg.Auth, policy: cfg.Policy, reg: cfg.Registry, ready: make(chan struct{})}
	s.e.HideBanner, s.e.HidePort = true, true
	s.e.HTTPErrorHandler = s.errorHandler
	s.reqs = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vgpu_bridge_http_request_duration_seconds",
		Help:    "HTTP requests by route, method and status code.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"route", "method", "code"})
	s.reg.MustRegister(s.reqs)
	s.e.Use(s.recoverMW, s.requestIDMW, s.accessLogMW, s.inputMW)
	s.doc = baseDocument(cfg.Version)

	s.Handle(http.MethodGet, "/", Public, s.versions)
	s.Handle(http.MethodGet, "/v1/", Public, s.version)
	s.Handle(http.MethodGet, "/healthcheck", Public, s.healthcheck)
	s.Handle(http.MethodGet, "/healthz", Public, s.healthz)
	s.Handle(http.MethodGet, "/readyz", Public, s.readyz)
	s.Handle(http.MethodGet, "/metrics", Public, echo.WrapHandler(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg})))
	s.Handle(http.MethodGet, "/v1/openapi.json", Public, s.openapi)
	s.Describe(foundationFragment)
	return s
}

// Echo exposes the underlying router for tests.
func (s *Server) Echo() *echo.Echo { return s.e }

// Registry returns the metrics registry the server exposes.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Handle registers a route. Its access rule (rules.go; RuleFor) decides
// which callers pass the authentication middleware; access is the class
// the rule's default gives it, checked here so that x-vgpu-access in
// the document is what the defaults enforce. A route with no rule of its
// own is guarded by its class's default. A GET route answers HEAD too.
func (s *Server) Handle(method, path string, access Access, h echo.HandlerFunc, mw ...echo.MiddlewareFunc) {
	rule := ""
	if r := RuleFor(method, path); r != nil {
		if r.Class != access {
			panic(fmt.Sprintf("api: %s %s is registered as %s, its rule %s's default makes it %s", method, path, access, r.Name, r.Class))
		}
		rule = r.Name
	} else if access == Project || access == Fleet || access == Admin {
		rule = classRulePrefix + access.String()
	}
	key := strings.ToLower(method) + " " + OpenAPIPath(path)
	s.docMu.Lock()
	if s.access == nil {
		s.access, s.rules = map[string]Access{}, map[string]string{}
	}
	s.access[key] = access
	if rule != "" && !strings.HasPrefix(rule, classRulePrefix) {
		s.rules[key] = rule
	}
	s.docMu.Unlock()
	if access == Custom {
		rule = ""
	}
	mws := append([]echo.MiddlewareFunc{s.requireAccess(access, rule)}, mw...)
	if access != Custom {
		mws = append([]echo.MiddlewareFunc{s.bodyLimitMW(s.cfg.MaxBodyBytes), bodyMW}, mws...)
	}
	s.e.Add(method, path, h, mws...)
	if method == http.MethodGet {
		// HEAD is GET without the body (net/http drops what the handler
		// writes), with the same checks.
		s.e.Add(http.MethodHead, path, h, mws...)
	}
}

// AddCheck adds a readiness check; /readyz fails naming it when it fails.
func (s *Server) AddCheck(name string, fn Checker) {
	s.checks = append(s.checks, namedCheck{name, fn})
}

// versions is the version discovery document OpenStack clients read at
// a service's root: the one API version, v1, and the running build.
func (s *Server) versions(c echo.Context) error {
	doc := struct {
		Versions []apiVersion      `json:"versions"`
		Build    map[string]string `json:"build"`
	}{
		Versions: []apiVersion{v1(c)},
		Build:    s.build(),
	}
	return c.JSON(http.StatusOK, doc)
}

// version is the document of the one version, at the link the root's
// document gives (GET /v1/), as OpenStack services answer there.
func (s *Server) version(c echo.Context) error {
	doc := struct {
		Version apiVersion        `json:"version"`
		Build   map[string]string `json:"build"`
	}{Version: v1(c), Build: s.build()}
	return c.JSON(http.StatusOK, doc)
}

type link struct {
	Rel  string `json:"rel"`
	Href string `json:"href"`
}

type apiVersion struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Links  []link `json:"links"`
}

func v1(c echo.Context) apiVersion {
	base := c.Scheme() + "://" + c.Request().Host
	return apiVersion{ID: "v1", Status: "CURRENT", Links: []link{
		{Rel: "self", Href: base + "/v1/"},
		{Rel: "describedby", Href: base + "/v1/openapi.json"},
	}}
}

func (s *Server) build() map[string]string {
	return map[string]string{"name": "vgpu-bridge", "version": cmp.Or(s.cfg.Version, version.Version()), "commit": version.Commit()}
}

// healthcheck answers as oslo.middleware's healthcheck with its
// disable_by_file backend: 200 OK (HEAD 204), or 503 DISABLED BY FILE
// while [healthcheck] disable_by_file_path exists; JSON when asked for.
// It says the process serves, not that its dependencies do (/readyz).
func (s *Server) healthcheck(c echo.Context) error {
	healthy, reason := true, "OK"
	if f := s.cfg.DisableByFile; f != "" {
		if _, err := os.Stat(f); err == nil {
			healthy, reason = false, "DISABLED BY FILE"
		}
	}
	status := http.StatusOK
	if !healthy {
		status = http.StatusServiceUnavailable
	}
	if c.Request().Method == http.MethodHead {
		if healthy {
			status = http.StatusNoContent
		}
		return c.NoContent(status)
	}
	if strings.Contains(c.Request().Header.Get(echo.HeaderAccept), echo.MIMEApplicationJSON) {
		return c.JSON(status, map[string]any{"reasons": []string{reason}, "detailed": false})
	}
	return c.String(status, reason)
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

type readiness struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

// Checks runs every readiness check at once and returns each one's
// outcome ("ok" or its error) by name, as /readyz reports them.
func (s *Server) Checks(ctx context.Context) map[string]string {
	type res struct {
		name string
		err  error
	}
	out := make(chan res, len(s.checks))
	for _, ch := range s.checks {
		go func() { out <- res{ch.name, ch.fn(ctx)} }()
	}
	m := make(map[string]string, len(s.checks))
	for range s.checks {
		x := <-out
		m[x.name] = "ok"
		if x.err != nil {
			m[x.name] = x.err.Error()
		}
	}
	return m
}

func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	r := readiness{Status: "ready", Checks: s.Checks(ctx)}
	var failing []string
	for name, v := range r.Checks {
		if v != "ok" {
			failing = append(failing, name)
		}
	}
	if len(failing) > 0 {
		sort.Strings(failing)
		p := &ProblemDetails{Status: http.StatusServiceUnavailable, Title: "Not ready",
			Detail: "unreachable: " + strings.Join(failing, ", "), Code: "not_ready"}
		for _, f := range failing {
			p.InvalidParams = append(p.InvalidParams, InvalidParam{Name: f, Reason: r.Checks[f]})
		}
		return p
	}
	return c.JSON(http.StatusOK, r)
}

// Start listens and serves in the background; Addr is valid afterwards.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("api listen %s: %w", s.cfg.Listen, err)
	}
	if s.cfg.TLSConfig != nil {
		ln = tls.NewListener(ln, s.cfg.TLSConfig)
	} else {
		ln = problemListener{ln} // net/http's own refusals as problem+json (malformed.go)
	}
	s.lnMu.Lock()
	s.ln = ln
	s.lnMu.Unlock()
	s.http = &http.Server{
		Handler:           s.e,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		// Go's own limit answers text/plain: it stays well above the
		// configured one, which inputMW enforces with problem+json.
		MaxHeaderBytes: max(1<<20, 4*s.headerLimit()),
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	go func() {
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("api server stopped", "err", err)
		}
	}()
	close(s.ready)
	s.log.Info("api listening", "addr", ln.Addr().String(), "tls", s.cfg.TLSConfig != nil)
	return nil
}

// Addr returns the listening address once started.
func (s *Server) Addr() string {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Run starts the server and serves until ctx ends, then drains in-flight
// requests for up to ShutdownGrace.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	return s.Shutdown()
}

// Shutdown drains in-flight requests.
func (s *Server) Shutdown() error {
	if s.http == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	if err := s.http.Shutdown(ctx); err != nil {
		return fmt.Errorf("api shutdown: %w", err)
	}
	return nil
}

// headerLimit is the most a request's header may hold ([api]
// max_header_bytes).
func (s *Server) headerLimit() int { return s.cfg.MaxHeaderBytes }

const requestIDHeader = "X-OpenStack-Request-ID"

// RequestID returns the request's id ("req-<uuid>", OpenStack style).
func RequestID(c echo.Context) string {
	id, _ := c.Get(logkey.RequestID).(string)
	return id
}

func (s *Server) requestIDMW(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := c.Request().Header.Get(requestIDHeader)
		if !validRequestID(id) {
			id = "req-" + uuid.NewString()
		}
		c.Set(logkey.RequestID, id)
		c.Response().Header().Set(requestIDHeader, id)
		// Outgoing OpenStack calls and context logs of the handler carry it.
		c.SetRequest(c.Request().WithContext(requestid.With(c.Request().Context(), id)))
		return next(c)
	}
}

func validRequestID(id string) bool {
	if !strings.HasPrefix(id, "req-") {
		return false
	}
	_, err := uuid.Parse(id[4:])
	return err == nil
}

func (s *Server) accessLogMW(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		d := time.Since(start)
		status := c.Response().Status
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		s.reqs.WithLabelValues(route, c.Request().Method, strconv.Itoa(status)).Observe(d.Seconds())
		level := slog.LevelInfo
		if route == "/healthz" || route == "/readyz" || route == "/metrics" {
			level = slog.LevelDebug
		}
		attrs := []slog.Attr{
			slog.String(logkey.RequestID, RequestID(c)),
			slog.String(logkey.Method, c.Request().Method),
			slog.String(logkey.Path, c.Request().URL.Path),
			slog.Int(logkey.Status, status),
			slog.String(logkey.Remote, c.RealIP()),
			slog.Duration(logkey.Duration, d),
		}
		if p := PrincipalFrom(c); p != nil {
			attrs = append(attrs, slog.String(logkey.Principal, p.Name))
		}
		s.log.LogAttrs(c.Request().Context(), level, "http request", attrs...)
		return nil
	}
}

func (s *Server) recoverMW(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				s.log.Error("handler panic", slog.String(logkey.RequestID, RequestID(c)), slog.Any("panic", r))
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return next(c)
	}
}

func (s *Server) bodyLimitMW(limit int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if r.ContentLength > limit {
				return Problem(http.StatusRequestEntityTooLarge, "Request Entity Too Large",
					fmt.Sprintf("the body may hold at most %d bytes", limit))
			}
			r.Body = http.MaxBytesReader(c.Response(), r.Body, limit)
			return next(c)
		}
	}
}

// DecodeJSON reads c's body as exactly one JSON value into v, refusing
// unknown fields; errors are problems naming what is wrong.
func DecodeJSON(c echo.Context, v any) error {
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return Problem(http.StatusRequestEntityTooLarge, "Request Entity Too Large",
				fmt.Sprintf("the body may hold at most %d bytes", mbe.Limit))
		}
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return ValidationProblem([]InvalidParam{{Name: ute.Field, Reason: "must be " + ute.Type.String()}})
		}
		if strings.HasPrefix(err.Error(), "json: unknown field ") {
			return ValidationProblem([]InvalidParam{{Name: strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), Reason: "unknown field"}})
		}
		return Problem(http.StatusBadRequest, "Bad Request", "the body is not valid JSON: "+err.Error())
	}
	if dec.More() {
		return Problem(http.StatusBadRequest, "Bad Request", "the body holds more than one JSON value")
	}
	return nil
}

func jsonEncode(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
