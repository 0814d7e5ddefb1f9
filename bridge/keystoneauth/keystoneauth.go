// Package keystoneauth authenticates operator API callers with Keystone
// tokens ([api] auth_strategy = keystone).
//
// An Authenticator validates the X-Auth-Token (or Authorization: Bearer)
// of a request with Keystone's identity v3 API, keeps the answer in a
// bounded cache until the token expires or the cache TTL ends (failures a
// shorter while; a validation Keystone did not answer, a few seconds),
// maps the token's roles and scope to the API's admin, reader and member
// with the base access rules (api.Policy.Classify; their defaults are
// written from the role lists), and limits a non-admin, project-scoped
// caller to its project.
// Tokens are never logged, and the cache keys on their SHA-256.
package keystoneauth

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// TokenInfo is what Keystone says about a valid token.
type TokenInfo struct {
	UserID, UserName, UserDomain string
	// ProjectID and ProjectName are set for a project-scoped token.
	ProjectID, ProjectName string
	// DomainID is set for a domain-scoped token.
	DomainID string
	// System is true for a system-scoped token.
	System    bool
	Roles     []string
	ExpiresAt time.Time
}

// ErrInvalidToken says Keystone does not accept the token: unknown,
// malformed, expired or revoked.
var ErrInvalidToken = errors.New("keystone: token not valid")

// Validator asks Keystone about a token. Keystone implements it; tests use
// fakes.
type Validator interface {
	// Validate returns the token's details, ErrInvalidToken when Keystone
	// refuses the token, or another error when Keystone could not answer
	// (unreachable, our own credentials refused, 5xx). Errors never hold
	// the token.
	Validate(ctx context.Context, token string) (*TokenInfo, error)
}

// Config configures an Authenticator.
type Config struct {
	Validator Validator
	// AdminRoles and ReaderRoles are Keystone role names (compared without
	// regard to case). A token holding one of AdminRoles is admin and sees
	// every project; one holding only ReaderRoles is reader, limited to its
	// project unless system-scoped.
	AdminRoles, ReaderRoles []string
	// FleetReaderRoles make a reader a fleet reader whatever its token's
	// scope: it sees every project and the fleet routes (hosts, GPUs,
	// drift, status), read-only. A system-scoped reader is one anyway.
	FleetReaderRoles []string
	// MemberRoles make a project-scoped reader a member: it may also ask
	// for changes to its project's instances (POST /v1/requests).
	MemberRoles []string
	// CacheTTL bounds how long a validated token is trusted before Keystone
	// is asked again (never past the token's expiry): the longest a revoked
	// token is still accepted. 0 asks Keystone on every request.
	CacheTTL time.Duration
	// InvalidCacheTTL is how long a refused token is remembered as refused.
	InvalidCacheTTL time.Duration
	// CacheSize bounds the cache (least recently used entries go first);
	// default DefaultConfig's.
	CacheSize int
	// Timeout of one validation; default DefaultConfig's.
	Timeout time.Duration
	// ChallengeURI is the Keystone URL a 401 answer names
	// (WWW-Authenticate: Keystone uri="..."), where a caller gets a token.
	ChallengeURI string
	// Policy holds the access rules whose base rules (admin,
	// fleet_reader, project_member, project_reader) say what a token's
	// caller is; nil: their defaults, written from the role lists above.
	Policy *api.Policy
	Logger *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Authenticator implements api.Authenticator with Keystone tokens.
type Authenticator struct {
	cfg    Config
	admin  []string
	reader []string
	cache  *cache
	group  singleflight.Group
	log    *slog.Logger
	now    func() time.Time

	validations *prometheus.CounterVec // by result
	lookups     *prometheus.CounterVec // cache hit or miss
	latency     prometheus.Histogram   // of Keystone calls
}

var _ api.Authenticator = (*Authenticator)(nil)

// New returns an Authenticator; cfg.Validator is required.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Validator == nil {
		return nil, errors.New("keystoneauth: no validator")
	}
	if len(lower(cfg.AdminRoles)) == 0 && len(lower(cfg.ReaderRoles)) == 0 {
		return nil, errors.New("keystoneauth: no admin or reader roles")
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = DefaultConfig().CacheSize
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultConfig().Timeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Policy == nil {
		pol, err := api.NewPolicy(cfg.RoleNames(), nil)
		if err != nil {
			return nil, fmt.Errorf("keystoneauth: %w", err)
		}
		cfg.Policy = pol
	}
	a := &Authenticator{cfg: cfg, admin: lower(cfg.AdminRoles), reader: lower(cfg.ReaderRoles),
		cache: newCache(cfg.CacheSize), log: cfg.Logger, now: cfg.Now,
		validations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_bridge_keystone_validations_total",
			Help: "Token validations asked of Keystone, by result: valid, forbidden (no known role), refused (invalid, expired, revoked), error (Keystone did not answer).",
		}, []string{"result"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_bridge_keystone_cache_lookups_total",
			Help: "Token lookups in the validation cache, by result: hit or miss.",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vgpu_bridge_keystone_validation_duration_seconds",
			Help:    "Duration of token validations asked of Keystone.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	for _, r := range []string{"valid", "forbidden", "refused", "error"} {
		a.validations.WithLabelValues(r) // exported as 0 from the start
	}
	a.lookups.WithLabelValues("hit")
	a.lookups.WithLabelValues("miss")
	return a, nil
}

// RoleNames are the role lists the base access rules' defaults are
// written with.
func (c Config) RoleNames() api.RoleNames {
	return api.RoleNames{Admin: c.AdminRoles, Reader: c.ReaderRoles, Member: c.MemberRoles, FleetReader: c.FleetReaderRoles}
}

// Collectors are the Authenticator's metrics, for the bridge's registry.
func (a *Authenticator) Collectors() []prometheus.Collector {
	return []prometheus.Collector{a.validations, a.lookups, a.latency}
}

func lower(ss []string) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		if s = strings.ToLower(strings.TrimSpace(s)); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// SetLogger replaces the logger (before the server starts).
func (a *Authenticator) SetLogger(l *slog.Logger) {
	if l != nil {
		a.log = l
	}
}

// CacheLen is the number of cached validations (tests, metrics).
func (a *Authenticator) CacheLen() int { return a.cache.len() }

// outcome is a validation's cached result: a principal, or a refusal.
// A token Keystone accepted keeps what Keystone said of it (info), and
// what the caller may do is read from it with the access rules in force
// at each request, so that a policy file reloaded (SIGHUP) applies to
// cached tokens too.
type outcome struct {
	info      *TokenInfo // set when Keystone accepted the token
	principal *api.Principal
	status    int // 401 or 403 when refused
	code      string
	detail    string
}

func (a *Authenticator) result(o *outcome) (*api.Principal, error) {
	if o.info != nil {
		o = a.outcome(o.info)
	}
	if o.principal != nil {
		p := *o.principal
		return &p, nil
	}
	if o.status == http.StatusServiceUnavailable {
		return nil, unavailable(o.detail)
	}
	return nil, a.refusal(o.status, o.code, o.detail)
}

// refusal is the answer to a caller refused; a 401 names where to get a
// token (as keystonemiddleware's challenge).
func (a *Authenticator) refusal(status int, code, detail string) *api.ProblemDetails {
	p := &api.ProblemDetails{Status: status, Title: http.StatusText(status), Code: code, Detail: detail}
	if status == http.StatusUnauthorized {
		p.Headers = map[string]string{"WWW-Authenticate": "Keystone uri=" + strconv.Quote(a.cfg.ChallengeURI)}
	}
	return p
}

// Authenticate implements api.Authenticator: 401 without a token or with
// one Keystone refuses, 403 when the token holds none of the configured
// roles, 503 when Keystone cannot answer (not cached).
func (a *Authenticator) Authenticate(r *http.Request) (*api.Principal, error) {
	tok := api.BearerToken(r)
	if tok == "" {
		return nil, a.refusal(http.StatusUnauthorized, "no_token", "send a Keystone token in X-Auth-Token")
	}
	key := sha256.Sum256([]byte(tok))
	if o, ok := a.cache.get(key, a.now()); ok {
		a.lookups.WithLabelValues("hit").Inc()
		return a.result(o)
	}
	a.lookups.WithLabelValues("miss").Inc()
	// One validation per token at a time, bounded by the timeout; it
	// outlives a caller that goes away, since others may wait on it.
	// Each caller waits only as long as its own request lasts.
	ch := a.group.DoChan(string(key[:]), func() (any, error) {
		return a.validate(context.WithoutCancel(r.Context()), tok, key)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return a.result(res.Val.(*outcome))
	case <-r.Context().Done():
		return nil, unavailable("Keystone did not validate the token before the request ended; try again")
	}
}

// outageRetry is how long a token whose validation Keystone did not answer
// is answered 503 without asking again: its callers are told to retry
// after it (Retry-After), and a hanging Keystone is not asked back to back.
const outageRetry = 5 * time.Second

func unavailable(detail string) *api.ProblemDetails {
	return &api.ProblemDetails{Status: http.StatusServiceUnavailable, Title: "Service Unavailable",
		Code: "identity_unavailable", Detail: detail,
		Headers: map[string]string{"Retry-After": strconv.Itoa(int(outageRetry / time.Second))}}
}

func (a *Authenticator) validate(ctx context.Context, tok string, key [32]byte) (*outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	start := time.Now()
	info, err := a.cfg.Validator.Validate(ctx, tok)
	a.latency.Observe(time.Since(start).Seconds())
	now := a.now()
	if errors.Is(err, ErrInvalidToken) || (err == nil && !info.ExpiresAt.IsZero() && !info.ExpiresAt.After(now)) {
		a.validations.WithLabelValues("refused").Inc()
		o := &outcome{status: http.StatusUnauthorized, code: "bad_token", detail: "Keystone does not accept the token (unknown, expired or revoked)"}
		a.remember(key, o, now, now.Add(a.cfg.InvalidCacheTTL))
		return o, nil
	}
	if err != nil {
		a.validations.WithLabelValues("error").Inc()
		a.log.Warn("keystone token validation failed", logkey.Err, err.Error())
		o := &outcome{status: http.StatusServiceUnavailable, code: "identity_unavailable",
			detail: "Keystone could not validate the token; try again"}
		a.remember(key, o, now, now.Add(outageRetry))
		return o, nil
	}
	o := a.outcome(info)
	until := now.Add(a.cfg.CacheTTL)
	if !info.ExpiresAt.IsZero() && info.ExpiresAt.Before(until) {
		until = info.ExpiresAt
	}
	a.remember(key, o, now, until)
	if o.principal == nil {
		a.validations.WithLabelValues("forbidden").Inc()
	} else {
		a.validations.WithLabelValues("valid").Inc()
		a.log.Debug("keystone token validated", logkey.User, info.UserID, logkey.Project, info.ProjectID, logkey.Role, string(o.principal.Role))
	}
	return o, nil
}

func (a *Authenticator) remember(key [32]byte, o *outcome, now, until time.Time) {
	if until.After(now) {
		a.cache.put(key, o, until)
	}
}

// outcome maps a valid token's roles and scope to a principal or a 403.
// The principal's name is the user's and project's names, for people; its
// id their ids, unique across domains, for what is kept per caller.
func (a *Authenticator) outcome(ti *TokenInfo) *outcome {
	name, id := cmp.Or(ti.UserName, ti.UserID), ti.UserID
	scope := ""
	switch {
	case ti.ProjectID != "":
		name += "@" + cmp.Or(ti.ProjectName, ti.ProjectID)
		scope = "@" + ti.ProjectID
	case ti.System:
		name += "@system"
		scope = "@system"
	case ti.DomainID != "":
		name += "@domain:" + ti.DomainID
		scope = "@domain:" + ti.DomainID
	}
	if id != "" {
		id += scope
	}
	creds := api.Credentials{UserID: ti.UserID, ProjectID: ti.ProjectID, DomainID: ti.DomainID, System: ti.System, Roles: ti.Roles}
	role, project, ok := a.cfg.Policy.Classify(creds)
	// A caller no base rule admits is let in only when a policy file may
	// open routes to it; with the defaults it could use none, and is told
	// why here, as before there were rules.
	if ok && (role != api.RoleNone || len(a.cfg.Policy.Overridden()) > 0) {
		return &outcome{info: ti, principal: &api.Principal{Name: name, ID: id, Role: role, Project: project, Creds: creds}}
	}
	if hasAny(ti.Roles, a.reader) && role == api.RoleNone {
		return &outcome{info: ti, status: http.StatusForbidden, code: "forbidden",
			detail: "a reader needs a project-scoped (or system-scoped) token; this one is scoped to no project"}
	}
	roles := append([]string(nil), ti.Roles...)
	sort.Strings(roles)
	return &outcome{info: ti, status: http.StatusForbidden, code: "forbidden",
		detail: fmt.Sprintf("the token's roles [%s] include none of [keystone] admin_roles [%s] or reader_roles [%s]",
			strings.Join(roles, ", "), strings.Join(a.admin, ", "), strings.Join(a.reader, ", "))}
}

func hasAny(roles, want []string) bool {
	for _, r := range roles {
		for _, w := range want {
			if strings.EqualFold(r, w) {
				return true
			}
		}
	}
	return false
}
