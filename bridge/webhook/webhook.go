// Package webhook is the bridge's webhook endpoint, POST /v1/webhooks/{source}
// : external schedulers and monitoring ask for or give back
// vGPU. It sits on the network edge, so it refuses precisely, in a fixed
// order (unknown source 404, address 403, rate 429, content type 415, size
// 413, auth 401 (503 while a jwt source's keys cannot be fetched), not JSON 400, schema
// 422, projects 403, the projects' rate 429, idempotency conflict 409), and
// answers 202 only once the request and its events are committed to
// Postgres. Commits are grouped: concurrent requests share a transaction,
// and each answer still waits for its own commit.
//
// When a request reaches a final state (requests.Store.Transition), its
// callback is POSTed, signed like the source signs, at least once, with
// backoff; every attempt is recorded; only hosts on the source's allowlist
// are ever contacted.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/clock"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

//go:embed openapi.json
var openapiFragment []byte

// OpenAPI returns the OpenAPI fragment of the webhook route.
func OpenAPI() []byte { return openapiFragment }

// Auth is how a source authenticates.
type Auth string

// Auth schemes.
const (
	AuthHMAC   Auth = "hmac"
	AuthBearer Auth = "bearer"
	AuthMTLS   Auth = "mtls"
	AuthJWT    Auth = "jwt"
)

// Format is a source's payload format.
type Format string

// Payload formats.
const (
	FormatNative       Format = "native"
	FormatAlertmanager Format = "alertmanager"
)

// Source is one [webhook_source:NAME].
type Source struct {
	Name   string
	Auth   Auth
	Format Format
	// Secrets are HMAC keys (SecretKey); several during a rotation. They
	// sign callbacks too.
	Secrets [][]byte
	// Tokens are the accepted bearer tokens; several during a rotation.
	Tokens []string
	// AllowedCIDRs limit client addresses; empty allows any.
	AllowedCIDRs []netip.Prefix
	// AllowedProjects are the projects whose instances the source may act
	// on; empty allows any. An instance the bridge does not know (no Nova
	// notification yet) is in none.
	AllowedProjects []string
	// TrustedProxies may set X-Forwarded-For; empty trusts none.
	TrustedProxies []netip.Prefix
	// Rate (requests/s) and Burst of the source's bucket; ClientRate and
	// ClientBurst of each client address's bucket (zero: as the source).
	Rate        float64
	Burst       int
	ClientRate  float64
	ClientBurst int
	// MaxBodyBytes bounds the body, enforced while reading.
	MaxBodyBytes int64
	// CallbackHosts are the hosts callback_url may name ("*.example.org"
	// for a domain); empty refuses every callback_url.
	CallbackHosts []string
	// InstanceLabel is the Alertmanager label naming the instance.
	InstanceLabel string
	// AlertMetrics renames an alert's numeric labels and annotations
	// (label or annotation name → metric name) as they become the
	// policy's metrics; the others keep their names.
	AlertMetrics map[string]string
	// MTLSSubjects (CN or full subject) and MTLSSANs (DNS, URI, e-mail,
	// IP) a client certificate may match.
	MTLSSubjects []string
	MTLSSANs     []string
	// TimestampTolerance bounds webhook-timestamp's skew (5 minutes).
	TimestampTolerance time.Duration
	// JWT (auth = jwt): tokens (Authorization: Bearer) signed with
	// RS256, ES256 or EdDSA by a key of the JWKS at JWKSURL or in
	// JWKSFile (exactly one), whose iss is JWTIssuer and whose aud holds
	// JWTAudience (DefaultJWTAudience of the source's name when empty;
	// no two jwt sources of one issuer may share one). JWTLeeway is the
	// clock skew allowed on exp, nbf and iat (0: none; at most
	// MaxJWTLeeway); JWTMaxLifetime the longest a token may be valid
	// for, exp − iat (DefaultJWTMaxLifetime when 0; at most
	// MaxJWTMaxLifetime).
	JWTIssuer      string
	JWTAudience    string
	JWKSURL        string
	JWKSFile       string
	JWTLeeway      time.Duration
	JWTMaxLifetime time.Duration
	// JWKSRefresh is the age at which keys fetched from JWKSURL are
	// fetched again (5m); JWKSMinInterval the least time between two
	// fetches (10s), tokens with a kid the keys lack included.
	JWKSRefresh     time.Duration
	JWKSMinInterval time.Duration
	// JWTProjectsClaim, when set, names the claim (a project id or an
	// array of them) that narrows AllowedProjects per token: a request
	// acts on instances of the token's projects only (intersected with
	// AllowedProjects when that is set); a token without it is refused.
	JWTProjectsClaim string
}

// Config configures an Endpoint.
type Config struct {
	Sources []Source
	Store   *requests.Store
	Pool    *pgxpool.Pool
	// PublicURL prefixes status_url ("https://bridge.example.org:9443");
	// empty gives a path.
	PublicURL string
	// IdempotencyTTL is how long keys are kept (24h).
	IdempotencyTTL time.Duration
	// BatchSize caps the requests committed in one transaction (256);
	// CommitWorkers is how many transactions run at once (1). One is
	// best where Postgres shares the host's CPUs: what queues during a
	// commit goes into the next, so the batches grow with the load and
	// each fsync and round trip serves more requests; more workers commit
	// smaller batches concurrently and spend more CPU per request.
	BatchSize     int
	CommitWorkers int
	// CommitTimeout bounds how long a request waits for its commit (10s).
	CommitTimeout time.Duration
	// MaxClients bounds the per-address rate limiters kept per source.
	MaxClients int
	// ProjectRate (requests/s) and ProjectBurst are each project's bucket,
	// shared by every source and POST /v1/requests: a request takes a
	// token of the project of each of its instances. Zero: no limit.
	ProjectRate  float64
	ProjectBurst int
	Callbacks    CallbackConfig
	Registerer   prometheus.Registerer
	Logger       *slog.Logger
	// OnCommitted, when set, is called after a commit that stored new
	// events, so the pipeline decides at once instead of at its next poll.
	OnCommitted func()
	// Lookup, when set, asks Nova for a server a project's caller names
	// that the bridge does not know yet, and stores it (ingest.Lookup),
	// before the caller's projects are checked (scopeTo).
	Lookup InstanceLookup
	// Now is the clock (time.Now).
	Now func() time.Time
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.IdempotencyTTL == 0 {
		c.IdempotencyTTL = d.IdempotencyTTL
	}
	if c.BatchSize == 0 {
		c.BatchSize = d.BatchSize
	}
	if c.CommitWorkers == 0 {
		c.CommitWorkers = d.CommitWorkers
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = d.CommitTimeout
	}
	if c.MaxClients == 0 {
		c.MaxClients = d.MaxClients
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Callbacks.setDefaults(d.Callbacks)
}

type source struct {
	cfg   Source // Secrets and Tokens as at start: use creds
	label string // "webhook:<name>"
	// event is the source name events carry (event.source in the
	// policy); cfg.Name when empty.
	event string
	lim   *limiters
	// creds are the secrets and tokens in use; SetCredentials (SIGHUP
	// reload) replaces them.
	creds atomic.Pointer[credentials]
	// jwt verifies the tokens of an auth = jwt source.
	jwt *jwtVerifier
}

// Endpoint serves POST /v1/webhooks/{source} and delivers callbacks.
type Endpoint struct {
	cfg     Config
	log     *slog.Logger
	sources map[string]*source
	store   *requests.Store
	pool    *pgxpool.Pool
	queue   chan *pending
	m       *metrics
	client  *http.Client
	// answerHead is what a 202's body without skipped entries holds
	// before its request id (answer).
	answerHead []byte
	// projectOf knows the instances' projects; projectLim limits each
	// project (nil: no limit).
	projectOf  *projectOf
	projectLim *projectLimiters

	bufs sync.Pool
	// waiting counts handlers between handing a request to the committers
	// and reading its outcome; after shutdown begins the committers stop
	// once it is zero and the queue is empty.
	waiting atomic.Int64
}

// New checks cfg and builds the endpoint.
func New(cfg Config) (*Endpoint, error) {
	cfg.setDefaults()
	if cfg.Store == nil || cfg.Pool == nil {
		return nil, errors.New("webhook: a request store and a pool are needed")
	}
	e := &Endpoint{cfg: cfg, log: cfg.Logger, sources: map[string]*source{}, store: cfg.Store, pool: cfg.Pool,
		queue: make(chan *pending, 8192)}
	e.bufs.New = func() any { return new(bytes.Buffer) }
	e.answerHead = answerHead(cfg.PublicURL)
	e.projectOf = newProjectOf(cfg.Pool, cfg.Now)
	e.projectLim = newProjectLimiters(cfg.ProjectRate, cfg.ProjectBurst, cfg.Now)
	var errs []error
	audiences := map[[2]string]string{} // a jwt source's issuer and audience → its name
	for _, s := range cfg.Sources {
		if _, dup := e.sources[s.Name]; dup {
			errs = append(errs, fmt.Errorf("source %q twice", s.Name))
			continue
		}
		if err := checkSource(&s); err != nil {
			errs = append(errs, fmt.Errorf("source %q: %w", s.Name, err))
			continue
		}
		src := &source{cfg: s, label: requests.WebhookSourcePrefix + s.Name,
			lim: newLimiters(s.Rate, s.Burst, s.ClientRate, s.ClientBurst, cfg.MaxClients)}
		src.creds.Store(newCredentials(s.Secrets, s.Tokens))
		if s.Auth == AuthJWT {
			// A token names the source it is for: one that another
			// source would accept too could be replayed there.
			k := [2]string{s.JWTIssuer, s.JWTAudience}
			if other, ok := audiences[k]; ok {
				errs = append(errs, fmt.Errorf("source %q: jwt_audience %q of issuer %q is source %q's too: a token issued for one "+
					"would be accepted by the other; give each source its own jwt_audience", s.Name, s.JWTAudience, s.JWTIssuer, other))
				continue
			}
			audiences[k] = s.Name
			v, err := newJWTVerifier(&s, cfg.Logger, cfg.Now)
			if err != nil {
				errs = append(errs, fmt.Errorf("source %q: jwks_file: %w", s.Name, err))
				continue
			}
			src.jwt = v
		}
		e.sources[s.Name] = src
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	e.m = newMetrics(cfg.Registerer)
	e.client = cfg.Callbacks.client()
	return e, nil
}

func checkSource(s *Source) error {
	if s.Name == "" {
		return errors.New("no name")
	}
	if s.Name == OperatorSource {
		return fmt.Errorf("the name %q is the source of POST /v1/requests (operator API credentials); choose another", OperatorSource)
	}
	switch s.Auth {
	case AuthHMAC:
		if len(s.Secrets) == 0 {
			return errors.New("auth = hmac needs at least one secret")
		}
	case AuthBearer:
		if len(s.Tokens) == 0 {
			return errors.New("auth = bearer needs at least one token")
		}
	case AuthMTLS:
		if len(s.MTLSSubjects)+len(s.MTLSSANs) == 0 {
			return errors.New("auth = mtls needs mtls_subjects or mtls_sans")
		}
	case AuthJWT:
		if err := checkJWT(s); err != nil {
			return err
		}
	default:
		return fmt.Errorf("auth %q is not hmac, bearer, mtls or jwt", s.Auth)
	}
	switch s.Format {
	case "":
		s.Format = FormatNative
	case FormatNative:
	case FormatAlertmanager:
		if s.Auth == AuthHMAC {
			return errors.New("format = alertmanager needs auth = bearer, jwt or mtls (Alertmanager cannot sign)")
		}
	default:
		return fmt.Errorf("format %q is not native or alertmanager", s.Format)
	}
	if s.Rate <= 0 || s.Burst < 1 {
		return errors.New("rate must be positive and burst at least 1")
	}
	if s.ClientRate <= 0 {
		s.ClientRate = s.Rate
	}
	if s.ClientBurst < 1 {
		s.ClientBurst = s.Burst
	}
	if s.MaxBodyBytes <= 0 {
		s.MaxBodyBytes = 64 << 10
	}
	if s.InstanceLabel == "" {
		s.InstanceLabel = DefaultInstanceLabel
	}
	if s.TimestampTolerance <= 0 {
		s.TimestampTolerance = DefaultTimestampTolerance
	}
	return nil
}

// Defaults of a [webhook_source:NAME]'s options that a zero Source field
// also takes; the bridge declares the options with them.
const (
	DefaultInstanceLabel      = "instance_uuid"
	DefaultTimestampTolerance = 5 * time.Minute
)

// checkJWT checks an auth = jwt source and sets its defaults.
func checkJWT(s *Source) error {
	switch {
	case s.JWTIssuer == "":
		return errors.New("auth = jwt needs jwt_issuer")
	case (s.JWKSURL == "") == (s.JWKSFile == ""):
		return errors.New("auth = jwt needs exactly one of jwks_url and jwks_file")
	case s.JWTLeeway < 0 || s.JWTLeeway > MaxJWTLeeway:
		return fmt.Errorf("jwt_leeway must be between 0 and %s", MaxJWTLeeway)
	case s.JWTMaxLifetime < 0 || s.JWTMaxLifetime > MaxJWTMaxLifetime:
		return fmt.Errorf("jwt_max_lifetime must be between 0 (%s) and %s", DefaultJWTMaxLifetime, MaxJWTMaxLifetime)
	}
	if s.JWTAudience == "" {
		s.JWTAudience = DefaultJWTAudience(s.Name)
	}
	if s.JWTMaxLifetime == 0 {
		s.JWTMaxLifetime = DefaultJWTMaxLifetime
	}
	if s.JWKSURL != "" {
		if err := CheckJWKSURL(s.JWKSURL); err != nil {
			return fmt.Errorf("jwks_url: %w", err)
		}
	}
	if s.JWKSRefresh <= 0 {
		s.JWKSRefresh = DefaultJWKSRefresh
	}
	if s.JWKSMinInterval <= 0 {
		s.JWKSMinInterval = defaultJWKSMinInterval
	}
	return nil
}

// Register adds POST /v1/webhooks/{source} to srv and describes it.
func (e *Endpoint) Register(srv *api.Server) {
	srv.Handle(http.MethodPost, "/v1/webhooks/:source", api.Custom, e.handle)
	srv.Describe(openapiFragment)
}

// Run commits accepted requests, delivers callbacks and forgets expired
// idempotency keys until ctx ends.
func (e *Endpoint) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, src := range e.sources {
		if src.jwt != nil {
			// Fetch a jwks_url's keys now: an unreachable issuer is
			// reported at start, not at the first token.
			wg.Go(func() { src.jwt.keys.prefetch(ctx) })
		}
	}
	for range e.cfg.CommitWorkers {
		wg.Add(1)
		go func() { defer wg.Done(); e.commitLoop(ctx) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); e.callbackLoop(ctx) }()
	go func() { defer wg.Done(); e.janitor(ctx) }()
	wg.Wait()
	return ctx.Err()
}

// Answer is the 202 body.
type Answer struct {
	RequestID uuid.UUID `json:"request_id"`
	StatusURL string    `json:"status_url"`
	Skipped   []Skipped `json:"skipped"`
}

func (e *Endpoint) refuse(c echo.Context, src, remote, reason string, p *api.ProblemDetails) error {
	p.Code = reason
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	label := src
	if label == "" {
		label = "(unknown)"
	}
	e.m.refused.WithLabelValues(label, reason).Inc()
	level := slog.LevelInfo
	if p.Status == http.StatusUnauthorized || p.Status == http.StatusForbidden {
		level = slog.LevelWarn
	}
	e.log.LogAttrs(c.Request().Context(), level, "webhook refused",
		slog.String(logkey.Source, src), slog.String(logkey.Remote, remote), slog.String(logkey.Reason, reason),
		slog.Int(logkey.Status, p.Status), slog.String(logkey.RequestID, api.RequestID(c)))
	return p
}

func (e *Endpoint) handle(c echo.Context) error {
	r := c.Request()
	now := e.cfg.Now()
	name := c.Param("source")
	// 404: unknown source. The name is logged only when it is known, so a
	// scanner cannot fill the log with its guesses.
	src := e.sources[name]
	if src == nil {
		return e.refuse(c, "", r.RemoteAddr, "unknown_source",
			&api.ProblemDetails{Status: http.StatusNotFound, Detail: "no webhook source of that name"})
	}
	// 403: address.
	addr, ok := clientIP(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), src.cfg.TrustedProxies)
	remote := addr.String()
	if !ok || (len(src.cfg.AllowedCIDRs) > 0 && !inAny(src.cfg.AllowedCIDRs, addr)) {
		return e.refuse(c, name, remote, "address_not_allowed",
			&api.ProblemDetails{Status: http.StatusForbidden, Detail: "this address may not send to this source"})
	}
	// 429: rate. The client's own bucket now; the source's only once the
	// request is authenticated, so that unauthenticated traffic never
	// uses up the source's budget.
	tooMany := func(reason string, wait time.Duration) error {
		ra := min(retryAfter(wait), 3600)
		return e.refuse(c, name, remote, reason, &api.ProblemDetails{Status: http.StatusTooManyRequests,
			Detail:  fmt.Sprintf("too many requests; retry in %d s", ra),
			Headers: map[string]string{"Retry-After": strconv.Itoa(ra)}})
	}
	if reason, wait := src.lim.allowClient(addr, now); reason != "" {
		return tooMany(reason, wait)
	}
	// 415: content type.
	if ct := r.Header.Get(echo.HeaderContentType); !api.IsJSONMediaType(ct) {
		return e.refuse(c, name, remote, "unsupported_media_type", &api.ProblemDetails{Status: http.StatusUnsupportedMediaType,
			Detail: "send Content-Type: application/json"})
	}
	// 413: size, enforced while reading.
	limit := src.cfg.MaxBodyBytes
	tooBig := func() error {
		// Close the connection after the answer instead of reading
		// the rest of a body nobody wants.
		return e.refuse(c, name, remote, "body_too_large", &api.ProblemDetails{Status: http.StatusRequestEntityTooLarge,
			Detail:  fmt.Sprintf("the body may hold at most %d bytes", limit),
			Headers: map[string]string{"Connection": "close"}})
	}
	if r.ContentLength > limit {
		return tooBig()
	}
	buf := e.bufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer e.bufs.Put(buf)
	// The net/http writer itself, so that passing the limit marks the
	// connection to be closed (echo's wrapper would hide it).
	if _, err := buf.ReadFrom(http.MaxBytesReader(c.Response().Writer, r.Body, limit)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooBig()
		}
		return e.refuse(c, name, remote, "body_unreadable", &api.ProblemDetails{Status: http.StatusBadRequest,
			Detail: "the body could not be read", Headers: map[string]string{"Connection": "close"}})
	}
	body := buf.Bytes()
	// 401: authentication.
	an, aerr := src.authenticate(r, body, now)
	if aerr != nil {
		p := &api.ProblemDetails{Status: cmp.Or(aerr.status, http.StatusUnauthorized), Detail: aerr.detail}
		switch {
		case p.Status == http.StatusServiceUnavailable:
			// jwks_unavailable: the sender retries.
			p.Headers = map[string]string{"Retry-After": strconv.Itoa(retryAfter(aerr.retryAfter))}
		case src.cfg.Auth == AuthBearer || src.cfg.Auth == AuthJWT:
			p.Headers = map[string]string{"WWW-Authenticate": `Bearer realm="vgpu-bridge webhooks"`}
		}
		return e.refuse(c, name, remote, aerr.reason, p)
	}
	key, bodyOnly := an.key, an.bodyOnly
	if reason, wait := src.lim.allowSource(now); reason != "" {
		return tooMany(reason, wait)
	}
	// 400: not JSON (or not UTF-8).
	if !json.Valid(body) {
		return e.refuse(c, name, remote, "not_json", &api.ProblemDetails{Status: http.StatusBadRequest,
			Detail: "the body is not valid JSON"})
	}
	textProblem := api.CheckJSONText(body)
	if textProblem != nil && textProblem.Status == http.StatusBadRequest {
		return e.refuse(c, name, remote, textProblem.Code, textProblem)
	}
	// 422: schema.
	p, bad := e.build(src, body, now)
	if key != "" && !validKey(key) {
		bad = append(bad, api.InvalidParam{Name: HeaderIdempotencyKey, Reason: "must be 1 to 255 printable ASCII characters"})
	}
	if textProblem != nil {
		bad = append(bad, textProblem.InvalidParams...)
	}
	if len(bad) > 0 {
		vp := api.ValidationProblem(bad)
		return e.refuse(c, name, remote, "invalid_params", vp)
	}
	// 401: a signed timestamp in the body past the tolerance.
	if !p.signedAt.IsZero() {
		if !clock.Within(p.signedAt, now, src.cfg.TimestampTolerance) {
			return e.refuse(c, name, remote, "timestamp_skew", &api.ProblemDetails{Status: http.StatusUnauthorized,
				Detail: fmt.Sprintf("the body's timestamp is %s of the server's clock; at most %s either way is allowed",
					clock.Offset(p.signedAt, now), src.cfg.TimestampTolerance)})
		}
	}
	// 403: instances of projects the source may not act on: its
	// allowed_projects, narrowed by the token's projects claim.
	allowed, scoped := src.cfg.AllowedProjects, len(src.cfg.AllowedProjects) > 0
	if an.scoped {
		allowed, scoped = narrowProjects(allowed, an.projects), true
	}
	if scoped {
		if refusal, err := e.scopeTo(r.Context(), allowed, src.cfg.Format, p); err != nil {
			e.log.Error("webhook: cannot read the instances' projects", logkey.Source, name, logkey.Err, err)
			prob := scopeUnavailable(err)
			return e.refuse(c, name, remote, prob.Code, prob)
		} else if refusal != "" {
			return e.refuse(c, name, remote, "project_not_allowed", &api.ProblemDetails{Status: http.StatusForbidden, Detail: refusal})
		}
	}
	// 429: the project of the instances has made too many requests.
	if prob := e.limitProjects(r.Context(), p); prob != nil {
		return e.refuse(c, name, remote, prob.Code, prob)
	}
	if an.space != "" {
		p.src = src.keySpace(an.space)
	}
	// A sender without a key of its scheme names the event in the body.
	p.key, p.bodyOnly = cmp.Or(key, p.eventID), bodyOnly
	p.hash = sha256.Sum256(body)
	// Commit, then 202; or 409 for a key reused with another body.
	res := e.commit(r.Context(), p)
	if res.err != nil {
		e.log.Error("webhook commit failed", logkey.Source, name, "err", res.err)
	}
	if prob := e.commitRefusal(res); prob != nil {
		return e.refuse(c, name, remote, prob.Code, prob)
	}
	if res.replay {
		e.m.replayed.WithLabelValues(name).Inc()
		c.Response().Header().Set("Idempotent-Replayed", "true")
	} else {
		e.m.accepted.WithLabelValues(name).Inc()
	}
	return c.JSONBlob(res.status, res.body)
}

// keySpace is src as a commit sees it for a caller with a key space of
// its own (space): its idempotency keys (and Alertmanager alerts) are
// kept apart from the other callers' of the source; its requests and
// events are the source's.
func (src *source) keySpace(space string) *source {
	return &source{cfg: Source{Name: src.cfg.Name + "#" + space, Format: src.cfg.Format}, label: src.label,
		event: cmp.Or(src.event, src.cfg.Name)}
}

// storeUnavailable is the 503 of a request that could not be checked or
// stored: the sender retries.
func storeUnavailable(what string) *api.ProblemDetails {
	return &api.ProblemDetails{Status: http.StatusServiceUnavailable, Code: "store_unavailable",
		Detail: "the request could not be " + what + "; retry", Headers: map[string]string{"Retry-After": "1"}}
}

// commitRefusal is the problem of a commit that neither created nor
// replayed a request; nil when it did one of them.
func (e *Endpoint) commitRefusal(res result) *api.ProblemDetails {
	switch {
	case res.err != nil:
		return storeUnavailable("stored")
	case res.conflict:
		return &api.ProblemDetails{Status: http.StatusConflict, Code: "idempotency_conflict",
			Detail: "this Idempotency-Key (or webhook-id) was used with another body within the last day"}
	case res.replayed:
		p := &api.ProblemDetails{Status: http.StatusConflict, Code: "replayed",
			Detail: "this signed body was accepted within the last day under another idempotency key (or none): " +
				"a signed body acts once; first_request_id is the request it made; to repeat a request, vary its body (a timestamp or a nonce)"}
		if res.first != uuid.Nil {
			// The same source sent it (claims are per source).
			p.FirstRequestID = res.first.String()
			p.StatusURL = e.cfg.PublicURL + "/v1/requests/" + p.FirstRequestID
		}
		return p
	}
	return nil
}

// build decodes body into a pending commit.
func (e *Endpoint) build(src *source, body []byte, now time.Time) (*pending, []api.InvalidParam) {
	id := uuid.Must(uuid.NewV7())
	p := &pending{src: src, done: make(chan result, 1)}
	evSource := cmp.Or(src.event, src.cfg.Name)
	p.req = requests.Request{ID: id, Source: src.label}
	ans := Answer{RequestID: id, StatusURL: e.cfg.PublicURL + "/v1/requests/" + id.String(), Skipped: []Skipped{}}
	switch src.cfg.Format {
	case FormatAlertmanager:
		b, bad := DecodeAlertmanager(body, src.cfg.InstanceLabel)
		if len(bad) > 0 {
			return nil, bad
		}
		p.req.Kind = TypeLoad
		ans.Skipped = b.Skipped
		for _, ev := range b.Events {
			a := ev.Alert
			at := a.StartsAt
			if a.Status == "resolved" && !a.EndsAt.IsZero() {
				at = a.EndsAt
			}
			p.events = append(p.events, eventRow{vm: ev.VMID, at: at, alert: ev.Index, payload: EventPayload{
				RequestID: id, Source: evSource, Type: TypeLoad, VMID: ev.VMID,
				Workload: workloadLabel(a.Labels), Metrics: alertMetrics(a, src.cfg.AlertMetrics), Alert: &a}})
		}
		if len(b.Events) == 1 {
			u := uuid.MustParse(b.Events[0].VMID)
			p.req.InstanceUUID = &u
		}
		if len(b.Events) == 0 {
			p.rejectReason = fmt.Sprintf("none of the %d alert(s) has a usable %s label", b.Alerts, src.cfg.InstanceLabel)
		}
		p.req.Body, _ = json.Marshal(b)
	default:
		n, bad := DecodeNative(body, func(h string) bool { return hostAllowed(src.cfg.CallbackHosts, h) })
		if len(bad) > 0 {
			return nil, bad
		}
		u := uuid.MustParse(n.VMID)
		p.req.Kind, p.req.InstanceUUID, p.req.CallbackURL = n.Type, &u, n.CallbackURL
		p.signedAt, p.eventID = n.Timestamp, n.EventID
		p.events = []eventRow{{vm: n.VMID, at: now, payload: EventPayload{RequestID: id, Source: evSource,
			Type: n.Type, VMID: n.VMID, Workload: n.Workload, VGPUProfile: n.VGPUProfile, Count: n.Count,
			Metrics: n.Metrics, CallbackURL: n.CallbackURL, GuestDriver: n.GuestDriver, Tune: n.Tune}}}
		p.req.Body, p.events[0].json = nativeJSON(n, id, evSource)
	}
	p.encodeEvents()
	if len(ans.Skipped) == 0 {
		p.answer = e.answer(id)
	} else {
		p.answer, _ = json.Marshal(ans)
	}
	return p, nil
}

// answerHead is the start of the JSON of an Answer, up to its request id
// in its status_url, for status URLs under publicURL.
func answerHead(publicURL string) []byte {
	u, _ := json.Marshal(publicURL + "/v1/requests/")
	head := []byte(`{"request_id":"` + uuid.Nil.String() + `","status_url":`)
	return append(head, u[:len(u)-1]...) // without its closing quote
}

// answer is the JSON of an Answer with no skipped entries, byte for byte
// what json.Marshal writes (the request id is ASCII that JSON never
// escapes), without its reflection: it is stored as the idempotency
// key's first answer and replayed as it is.
func (e *Endpoint) answer(id uuid.UUID) []byte {
	const tail = `","skipped":[]}`
	b := make([]byte, 0, len(e.answerHead)+36+len(tail))
	b = append(b, e.answerHead...)
	text := id.String()
	copy(b[len(`{"request_id":"`):], text) // in place of the nil id
	b = append(b, text...)
	return append(b, tail...)
}

// nativeJSON is the JSON of n (the request's body) and that of its inbox
// event's payload (EventPayload), from one encoding of n: the payload
// holds n's fields less those only the body has (timestamp, nonce,
// event_id), and the request id and the source before them. Both are
// stored as jsonb, where members have no order. The payload is empty
// when its encoding failed (encodeEvents encodes it again and tells).
func nativeJSON(n Native, id uuid.UUID, source string) (body json.RawMessage, payload string) {
	body, err := json.Marshal(n)
	if err != nil {
		return body, ""
	}
	common := body
	if !n.Timestamp.IsZero() || n.Nonce != "" || n.EventID != "" {
		c := n
		c.Timestamp, c.Nonce, c.EventID = time.Time{}, "", ""
		if common, err = json.Marshal(c); err != nil {
			return body, ""
		}
	}
	// A payload omits a count of 0, a body does not; a decoded body's
	// count is 1 at least.
	if n.Count == 0 || len(common) < 3 || common[0] != '{' || common[1] == '}' {
		return body, ""
	}
	src, _ := json.Marshal(source)
	return body, `{"request_id":"` + id.String() + `","source":` + string(src) + `,` + string(common[1:])
}

func workloadLabel(l map[string]string) string {
	if w := l["workload"]; oneOf(w, Workloads) {
		return w
	}
	return ""
}

// EventPayload is the payload of an inbox row (events, source
// "webhook:<name>") written for an accepted webhook.
type EventPayload = requests.WebhookEvent

// AuthenticateSource implements requests.SourceAuthenticator: a source
// reads its requests with its own credentials. HMAC sources sign the text
// "GET <path>" in place of a body. A jwt source's token that names its
// projects (jwt_projects_claim) is limited to them, as when it sends:
// those of the claim that allowed_projects (when set) holds.
func (e *Endpoint) AuthenticateSource(r *http.Request, name string) (projects []string, scoped bool, _ error) {
	src := e.sources[name]
	if src == nil {
		return nil, false, errors.New("no such source")
	}
	addr, ok := clientIP(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), src.cfg.TrustedProxies)
	if !ok || (len(src.cfg.AllowedCIDRs) > 0 && !inAny(src.cfg.AllowedCIDRs, addr)) {
		return nil, false, errors.New("address_not_allowed")
	}
	payload := []byte(r.Method + " " + r.URL.Path)
	an, aerr := src.authenticate(r, payload, e.cfg.Now())
	if aerr != nil {
		return nil, false, aerr
	}
	if an.scoped {
		return narrowProjects(src.cfg.AllowedProjects, an.projects), true, nil
	}
	return nil, false, nil
}

var _ requests.SourceAuthenticator = (*Endpoint)(nil)

// projectsOf reads the projects of the instances among ids the bridge
// knows.
func (e *Endpoint) projectsOf(ctx context.Context, ids []string) (map[string]string, error) {
	rows, err := e.pool.Query(ctx, `SELECT uuid::text, coalesce(project_id, '') FROM instances WHERE uuid = ANY($1::uuid[])`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	project := map[string]string{}
	for rows.Next() {
		var id, proj string
		if err := rows.Scan(&id, &proj); err != nil {
			return nil, err
		}
		project[id] = proj
	}
	return project, rows.Err()
}

// InstanceLookup looks up a server in Nova and stores it in the instances
// (ingest.Lookup.LookUp): false when Nova has none; an error when Nova
// could not be asked.
type InstanceLookup interface {
	LookUp(ctx context.Context, instance, project string) (bool, error)
}

// maxLookups bounds the servers one message makes the bridge ask Nova for;
// the others it names and the bridge does not know stay unknown.
const maxLookups = 8

// errNovaUnavailable is scopeTo's error when Nova could not be asked for
// a server the bridge does not know: the caller retries (503).
var errNovaUnavailable = errors.New("Nova could not be asked for the instance")

// lookUpUnknown asks Nova (Config.Lookup) for the ids the bridge does not
// know (not in known), at most maxLookups of them, with no transaction
// open; it reports whether it asked. The lookup stores what Nova has, of
// whatever project: the caller's projects are checked on the stored row,
// so a server of another project is refused as an unknown one is.
func (e *Endpoint) lookUpUnknown(ctx context.Context, ids []string, known map[string]string) (bool, error) {
	if e.cfg.Lookup == nil {
		return false, nil
	}
	asked := map[string]bool{}
	for _, id := range ids {
		if _, ok := known[id]; ok || asked[id] || len(asked) >= maxLookups {
			continue
		}
		asked[id] = true
		if _, err := e.cfg.Lookup.LookUp(ctx, id, ""); err != nil {
			return true, fmt.Errorf("%w: %w", errNovaUnavailable, err)
		}
	}
	return len(asked) > 0, nil
}

// scopeUnavailable is the problem of a scopeTo that failed.
func scopeUnavailable(err error) *api.ProblemDetails {
	if errors.Is(err, errNovaUnavailable) {
		return &api.ProblemDetails{Status: http.StatusServiceUnavailable, Code: "nova_unavailable",
			Detail:  "the request names an instance the bridge does not know yet, and Nova could not be asked for it; retry",
			Headers: map[string]string{"Retry-After": "5"}}
	}
	return storeUnavailable("checked")
}

// readAll is io.ReadAll with a bound, for callback answers.
func readAll(r io.Reader, n int64) []byte {
	b, _ := io.ReadAll(io.LimitReader(r, n))
	return b
}

// scopeTo keeps p to the instances of allowedProjects (a source's
// allowed projects, narrowed by a token's projects claim; a member's
// project). A native request for another project's instance, or for one
// the bridge does not know, is refused (the returned text); an
// Alertmanager message loses the alerts that name one, each listed as
// skipped. The refusal does not say which project the instance is in.
func (e *Endpoint) scopeTo(ctx context.Context, allowedProjects []string, format Format, p *pending) (string, error) {
	ids := make([]string, 0, len(p.events))
	for _, ev := range p.events {
		ids = append(ids, ev.vm)
	}
	project, err := e.projectsOf(ctx, ids)
	if err != nil {
		return "", err
	}
	if asked, err := e.lookUpUnknown(ctx, ids, project); err != nil {
		return "", err
	} else if asked {
		if project, err = e.projectsOf(ctx, ids); err != nil {
			return "", err
		}
	}
	allowed := func(vm string) bool {
		proj, ok := project[vm]
		return ok && slices.Contains(allowedProjects, proj)
	}
	if format != FormatAlertmanager {
		if !allowed(p.events[0].vm) {
			return fmt.Sprintf("instance %s is not in a project this source may act on (or the bridge does not know it yet)", p.events[0].vm), nil
		}
		return "", nil
	}
	var ans Answer
	if err := json.Unmarshal(p.answer, &ans); err != nil {
		return "", err
	}
	kept := p.events[:0]
	for _, ev := range p.events {
		if allowed(ev.vm) {
			kept = append(kept, ev)
			continue
		}
		ans.Skipped = append(ans.Skipped, Skipped{Index: ev.alert, Fingerprint: ev.payload.Alert.Fingerprint,
			AlertName: ev.payload.Alert.Labels["alertname"], Reason: "instance not in a project this source may act on"})
	}
	if len(kept) == len(p.events) {
		return "", nil
	}
	p.events = kept
	sort.Slice(ans.Skipped, func(i, j int) bool { return ans.Skipped[i].Index < ans.Skipped[j].Index })
	if p.answer, err = json.Marshal(ans); err != nil {
		return "", err
	}
	switch len(kept) {
	case 0:
		p.req.InstanceUUID = nil
		if p.rejectReason == "" {
			p.rejectReason = "none of the alerts names an instance of a project this source may act on"
		}
	case 1:
		u := uuid.MustParse(kept[0].vm)
		p.req.InstanceUUID = &u
	default:
		p.req.InstanceUUID = nil
	}
	return "", nil
}
