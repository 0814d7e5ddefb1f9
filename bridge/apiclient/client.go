package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// MaxAnswerBytes bounds the answers read; a longer one is an error.
const MaxAnswerBytes = 32 << 20

// RequestIDHeader carries OpenStack's request id both ways.
const RequestIDHeader = "X-OpenStack-Request-ID"

// TokenSource returns the token to send as X-Auth-Token; it is called once,
// at the first call that needs credentials (e.g. a Keystone login).
type TokenSource func(ctx context.Context) (string, error)

// Login is a TokenSource that also finds the API's base URL (Keystone's
// catalog); endpoint is "" when it found none.
type Login func(ctx context.Context) (token, endpoint string, err error)

// Config configures a Client.
type Config struct {
	// URL is the bridge API's base URL, e.g. http://127.0.0.1:9797.
	URL string
	// Token is sent as X-Auth-Token when not empty.
	Token string
	// TokenSource, when Token is empty, supplies the token once.
	TokenSource TokenSource
	// Login, when Token and TokenSource are empty, supplies the token
	// once, and the base URL too when URL is empty.
	Login Login
	// HTTPClient is used for every call; nil means a client with Timeout.
	HTTPClient *http.Client
	// Timeout bounds one call when HTTPClient is nil (default 30s).
	Timeout time.Duration
	// UserAgent is sent when not empty.
	UserAgent string
}

// Client calls the operator API. It is safe for concurrent use.
type Client struct {
	base  string
	http  *http.Client
	ua    string
	token string
	src   TokenSource
	login Login

	once   sync.Once
	tokErr error
}

// New returns a client of cfg.URL.
func New(cfg Config) *Client {
	hc := cfg.HTTPClient
	if hc == nil {
		t := cfg.Timeout
		if t == 0 {
			t = 30 * time.Second
		}
		hc = &http.Client{Timeout: t}
	}
	c := &Client{base: strings.TrimRight(cfg.URL, "/"), http: hc, ua: cfg.UserAgent, token: cfg.Token, src: cfg.TokenSource}
	if c.token == "" && c.src == nil && cfg.Login != nil {
		c.login = cfg.Login
		c.src = func(ctx context.Context) (string, error) {
			tok, endpoint, err := cfg.Login(ctx)
			if err == nil && c.base == "" {
				if endpoint == "" {
					return "", ErrNoEndpoint
				}
				c.base = strings.TrimRight(endpoint, "/")
			}
			return tok, err
		}
	}
	return c
}

// URL returns the base URL.
func (c *Client) URL() string { return c.base }

// InvalidParam names one field the API refused.
type InvalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Problem is an RFC 9457 problem answer.
type Problem struct {
	Type          string         `json:"type,omitempty"`
	Title         string         `json:"title"`
	Status        int            `json:"status"`
	Detail        string         `json:"detail,omitempty"`
	Instance      string         `json:"instance,omitempty"`
	Code          string         `json:"code,omitempty"`
	RequestID     string         `json:"request_id,omitempty"`
	InvalidParams []InvalidParam `json:"invalid_params,omitempty"`
}

// Error is an answer outside 2xx. Problem is filled from a problem+json
// body (or made up from the status when the body is something else).
type Error struct {
	Method, Path string
	Status       int
	Problem      Problem
	// Body is the answer as sent (at most MaxAnswerBytes).
	Body []byte
	// RetryAfter is the Retry-After header, if any.
	RetryAfter string
}

// Error renders "title: detail" and the invalid parameters, one a line.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Problem.Title)
	if e.Problem.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Problem.Detail)
	}
	for _, p := range e.Problem.InvalidParams {
		fmt.Fprintf(&b, "\n  %s: %s", p.Name, p.Reason)
	}
	return b.String()
}

// UnreachableError says no HTTP answer came back.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string { return fmt.Sprintf("cannot reach %s: %v", e.URL, e.Err) }
func (e *UnreachableError) Unwrap() error { return e.Err }

// ErrNoEndpoint: no URL was given and Keystone's catalog has no service
// of type ServiceType.
var ErrNoEndpoint = errors.New("no URL given and no " + ServiceType + " service in Keystone's catalog (vgpu-bridge keystone register adds it)")

// ErrToken wraps a failure of the TokenSource.
var ErrToken = errors.New("cannot get a token")

// IsUnreachable reports whether err means the API did not answer.
func IsUnreachable(err error) bool {
	var u *UnreachableError
	return errors.As(err, &u)
}

// StatusCode returns the HTTP status of an *Error in err's chain, or 0.
func StatusCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsNotFound reports whether the API answered 404.
func IsNotFound(err error) bool { return StatusCode(err) == http.StatusNotFound }

// AsError returns the *Error in err's chain.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// Response is a 2xx answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Call is one API call.
type Call struct {
	Method string
	Path   string     // e.g. /v1/hosts; escape path elements with url.PathEscape
	Query  url.Values // may be nil
	Body   any        // JSON-encoded unless []byte or json.RawMessage (sent as is)
	Header http.Header
	// NoAuth sends no operator token (public routes, webhooks).
	NoAuth bool
	// MaxBytes bounds the answer; 0 is MaxAnswerBytes (a diagnostics
	// bundle may be larger).
	MaxBytes int
}

func (c *Client) authToken(ctx context.Context) (string, error) {
	if c.token != "" || c.src == nil {
		return c.token, nil
	}
	c.once.Do(func() {
		t, err := c.src(ctx)
		if err != nil {
			c.tokErr = fmt.Errorf("%w: %w", ErrToken, err)
			return
		}
		c.token = t
	})
	return c.token, c.tokErr
}

// Do performs call and returns its 2xx answer, or an *Error, an
// *UnreachableError or a token error.
func (c *Client) Do(ctx context.Context, call Call) (*Response, error) {
	if c.login != nil {
		// The base URL may come with the login (Keystone's catalog): log
		// in first (once; later calls only wait for it).
		if _, err := c.authToken(ctx); err != nil {
			return nil, err
		}
	}
	u := c.base + call.Path
	if len(call.Query) > 0 {
		u += "?" + call.Query.Encode()
	}
	var body io.Reader
	switch b := call.Body.(type) {
	case nil:
	case []byte:
		body = bytes.NewReader(b)
	case json.RawMessage:
		body = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", call.Method, call.Path, err)
		}
		body = bytes.NewReader(enc)
	}
	req, err := http.NewRequestWithContext(ctx, call.Method, u, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range call.Header {
		req.Header[k] = vs
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.ua != "" {
		req.Header.Set("User-Agent", c.ua)
	}
	if !call.NoAuth {
		tok, err := c.authToken(ctx)
		if err != nil {
			return nil, err
		}
		if tok != "" {
			req.Header.Set("X-Auth-Token", tok)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &UnreachableError{URL: c.base, Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	limit := call.MaxBytes
	if limit <= 0 {
		limit = MaxAnswerBytes
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return nil, &UnreachableError{URL: c.base, Err: fmt.Errorf("reading the answer: %w", err)}
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s %s: answer larger than %d bytes", call.Method, call.Path, limit)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, newError(call, resp, b)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func newError(call Call, resp *http.Response, body []byte) *Error {
	e := &Error{Method: call.Method, Path: call.Path, Status: resp.StatusCode, Body: body, RetryAfter: resp.Header.Get("Retry-After")}
	ct := resp.Header.Get("Content-Type")
	if strings.Contains(ct, "json") && json.Unmarshal(body, &e.Problem) == nil && e.Problem.Title != "" {
		if e.Problem.Status == 0 {
			e.Problem.Status = resp.StatusCode
		}
	} else {
		e.Problem = Problem{Title: http.StatusText(resp.StatusCode), Status: resp.StatusCode}
		if e.Problem.Title == "" {
			e.Problem.Title = resp.Status
		}
		if s := strings.TrimSpace(string(body)); s != "" && len(s) < 300 && !strings.ContainsAny(s, "<\x00") {
			e.Problem.Detail = s
		}
	}
	if e.Problem.RequestID == "" {
		e.Problem.RequestID = resp.Header.Get(RequestIDHeader)
	}
	return e
}

// getInto GETs path and decodes the answer into out, returning the raw body.
func (c *Client) getInto(ctx context.Context, path string, q url.Values, out any) (json.RawMessage, error) {
	return c.callInto(ctx, Call{Method: http.MethodGet, Path: path, Query: q}, out)
}

func (c *Client) callInto(ctx context.Context, call Call, out any) (json.RawMessage, error) {
	r, err := c.Do(ctx, call)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(r.Body, out); err != nil {
		return r.Body, fmt.Errorf("%s %s: the answer is not the expected JSON: %w", call.Method, call.Path, err)
	}
	return r.Body, nil
}
