package placement

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	goretry "github.com/sethvargo/go-retry"

	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
)

// DefaultMicroversion is the Placement microversion the client speaks:
// 1.39 has consumer types (1.38), nested trees, in_tree, and repeated
// required parameters.
const DefaultMicroversion = "1.39"

// ClientConfig says how to reach Placement.
type ClientConfig struct {
	// Cloud names an entry of clouds.yaml (Keystone auth). Used when
	// Endpoint is empty, or to authenticate when no token is given.
	Cloud string
	// Endpoint overrides the catalog's Placement URL
	// ("http://127.0.0.1:8778").
	Endpoint string
	// Token is a static token sent as X-Auth-Token (noauth2: "admin").
	// TokenFile, if set, is read instead.
	Token     string
	TokenFile string
	// Microversion of every request; default [placement] microversion's
	// (DefaultMicroversion).
	Microversion string
	// Timeout of one HTTP request; default [placement] timeout's.
	Timeout time.Duration
	// HTTPClient replaces the default client (tests).
	HTTPClient *http.Client
	// WrapTransport, when set, wraps the default client's transport (the
	// bridge sets requestid.Transport: X-OpenStack-Request-ID from ctx).
	WrapTransport func(http.RoundTripper) http.RoundTripper
}

// Client calls Placement. It is safe for concurrent use.
type Client struct {
	sc *gophercloud.ServiceClient
}

// NewClient builds a client: endpoint + token when both are known,
// otherwise Keystone through clouds.yaml.
func NewClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if d := DefaultConfig().Client; cfg.Microversion == "" || cfg.Timeout == 0 {
		cfg.Microversion = cmp.Or(cfg.Microversion, d.Microversion)
		cfg.Timeout = cmp.Or(cfg.Timeout, d.Timeout)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 32
		var next http.RoundTripper = tr
		if cfg.WrapTransport != nil {
			next = cfg.WrapTransport(next)
		}
		hc = &http.Client{Timeout: cfg.Timeout, Transport: &staleConnRetry{next: next}}
	}
	token := cfg.Token
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("placement token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	sc, err := osclient.New(ctx, osclient.Config{Endpoint: cfg.Endpoint, Token: token, Cloud: cfg.Cloud, Type: "placement",
		FromCatalog: openstack.NewPlacementV1, HTTPClient: hc, Microversion: cfg.Microversion})
	var ae *osclient.AuthError
	switch {
	case errors.As(err, &ae):
		return nil, classify("authenticate", ae.Err)
	case errors.Is(err, osclient.ErrUnconfigured):
		return nil, errors.New("placement: set [openstack] cloud, or [placement] endpoint_override with token_file")
	case err != nil:
		return nil, err
	}
	return &Client{sc: sc}, nil
}

// ServiceClient exposes the gophercloud client for calls the bridge does
// not make itself (tests and the bench harness create providers with it).
func (c *Client) ServiceClient() *gophercloud.ServiceClient { return c.sc }

// Backoff paces the retries of one Placement call (conflicts, 5xx): from
// Base (20ms) doubling to Max (2s), by internal/backoff's policy. The zero
// value is ready to use.
type Backoff struct {
	Base, Max time.Duration
	b         goretry.Backoff
}

// Next returns the next wait.
func (b *Backoff) Next() time.Duration {
	b.init()
	d, _ := b.b.Next()
	return d
}

// Wait sleeps for Next or until ctx ends.
func (b *Backoff) Wait(ctx context.Context) error {
	b.init()
	return backoff.Wait(ctx, b.b)
}

func (b *Backoff) init() {
	if b.b == nil {
		b.b = backoff.Policy{Min: cmp.Or(b.Base, 20*time.Millisecond), Max: cmp.Or(b.Max, 2*time.Second)}.New()
	}
}

// retry runs fn until it succeeds, fails with a non-retryable error, or
// ctx ends. Reads use it; writes decide themselves.
func retry[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	var b Backoff
	for {
		v, err := fn()
		if err == nil || !IsRetryable(err) {
			return v, err
		}
		if werr := b.Wait(ctx); werr != nil {
			return v, err
		}
	}
}

// staleConnRetry resends a request once when it failed on a reused
// keep-alive connection before any answer came back: the server had
// closed the connection (WSGI servers without keep-alive do so without
// saying "Connection: close"). Go's transport only does this for GET-like
// requests; for our writes a resend is safe because allocation writes are
// guarded by generations.
type staleConnRetry struct{ next http.RoundTripper }

func (t *staleConnRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		r := req
		if attempt > 0 {
			r = req.Clone(req.Context())
			if req.Body != nil && req.Body != http.NoBody {
				b, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				r.Body = b
			}
		}
		resp, err := t.next.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
		if err == nil || !reused || attempt >= 3 || req.Context().Err() != nil || !staleConn(err) {
			return resp, err
		}
		if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
			return resp, err
		}
	}
}

// staleConn reports whether err is what a keep-alive connection closed by
// the server yields.
func staleConn(err error) bool {
	// net/http's errServerClosedIdle is unexported; its text is stable.
	return isConnErr(err) || strings.Contains(err.Error(), "server closed idle connection")
}
