package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// CallbackConfig configures callback delivery.
type CallbackConfig struct {
	// PollInterval is how often due callbacks are looked for (1s).
	PollInterval time.Duration
	// Timeout bounds one attempt (10s).
	Timeout time.Duration
	// MaxAttempts: after this many failed attempts the callback is failed (12).
	MaxAttempts int
	// BackoffMin and BackoffMax bound the wait between attempts, which
	// doubles from BackoffMin, with jitter (5s, 10m).
	BackoffMin, BackoffMax time.Duration
	// Lease is how long a replica holds a callback it is delivering; if it
	// dies, another replica retries after it (2m).
	Lease time.Duration
	// Parallel is how many callbacks are delivered at once (8).
	Parallel int
	// Transport, when set, replaces the HTTP transport (tests).
	Transport http.RoundTripper
}

func (c *CallbackConfig) setDefaults(d CallbackConfig) {
	if c.PollInterval == 0 {
		c.PollInterval = d.PollInterval
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = d.MaxAttempts
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = d.BackoffMin
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = d.BackoffMax
	}
	if c.Lease == 0 {
		c.Lease = d.Lease
	}
	if c.Parallel == 0 {
		c.Parallel = d.Parallel
	}
}

// client never follows redirects (a redirect could lead off the
// allowlist) and ignores proxy environment variables.
func (c *CallbackConfig) client() *http.Client {
	tr := c.Transport
	if tr == nil {
		tr = &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			TLSHandshakeTimeout:   5 * time.Second,
			ResponseHeaderTimeout: c.Timeout,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
		}
	}
	return &http.Client{
		Transport:     tr,
		Timeout:       c.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// dueCallback is a callback claimed for delivery.
type dueCallback = requests.DueCallback

func (e *Endpoint) callbackLoop(ctx context.Context) {
	wake.Every(ctx, e.cfg.Callbacks.PollInterval, func(ctx context.Context) {
		for {
			n, err := e.deliverDue(ctx)
			if err != nil {
				if ctx.Err() == nil {
					e.log.Warn("callbacks", "err", err)
				}
				break
			}
			if n < e.cfg.Callbacks.Parallel {
				break
			}
		}
	})
}

// deliverDue claims due callbacks for a lease and delivers them.
func (e *Endpoint) deliverDue(ctx context.Context) (int, error) {
	cc := e.cfg.Callbacks
	due, err := requests.ClaimCallbacks(ctx, e.pool, cc.Lease, cc.Parallel)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	for _, d := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.deliver(ctx, d); err != nil && ctx.Err() == nil {
				e.log.Warn("callback bookkeeping", "callback", d.ID, "err", err)
			}
		}()
	}
	wg.Wait()
	return len(due), nil
}

// deliver makes one attempt and records it.
func (e *Endpoint) deliver(ctx context.Context, d dueCallback) error {
	attempt := d.Attempts + 1
	src := e.sources[d.Source]
	var refusal string
	u, err := url.Parse(d.URL)
	switch {
	case src == nil:
		refusal = fmt.Sprintf("source %q is no longer configured", d.Source)
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil:
		refusal = "not an http or https URL without user information"
	case !hostAllowed(src.cfg.CallbackHosts, u.Hostname()):
		refusal = fmt.Sprintf("host %q is not on the callback_hosts allowlist of source %q", u.Hostname(), d.Source)
	}
	if refusal != "" {
		// Never contacted: recorded as an attempt without an answer.
		e.m.callbacks.WithLabelValues(d.Source, "refused").Inc()
		e.log.Warn("callback refused", logkey.Source, d.Source, "request", d.RequestID, logkey.Reason, refusal)
		return e.recordAttempt(ctx, d, attempt, 0, refusal, 0, "refused", 0)
	}
	start := time.Now()
	code, aerr := e.post(ctx, src, d)
	dur := time.Since(start)
	if aerr == nil && code >= 200 && code < 300 {
		e.m.callbacks.WithLabelValues(d.Source, "delivered").Inc()
		return e.recordAttempt(ctx, d, attempt, code, "", dur, "delivered", 0)
	}
	msg := ""
	if aerr != nil {
		msg = aerr.Error()
	} else {
		msg = "answered " + strconv.Itoa(code)
	}
	if attempt >= e.cfg.Callbacks.MaxAttempts {
		e.m.callbacks.WithLabelValues(d.Source, "failed").Inc()
		e.log.Warn("callback failed for good", logkey.Source, d.Source, "request", d.RequestID, "attempts", attempt, "err", msg)
		return e.recordAttempt(ctx, d, attempt, code, msg, dur, "failed", 0)
	}
	e.m.callbacks.WithLabelValues(d.Source, "retry").Inc()
	// attempt ≥ 1 attempts failed: the first retry waits BackoffMin.
	wait := backoff.Policy{Min: e.cfg.Callbacks.BackoffMin, Max: e.cfg.Callbacks.BackoffMax}.Delay(attempt - 1)
	return e.recordAttempt(ctx, d, attempt, code, msg, dur, "pending", wait)
}

func (e *Endpoint) post(ctx context.Context, src *source, d dueCallback) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Callbacks.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Payload))
	if err != nil {
		return 0, err
	}
	SignCallback(req.Header, src.current(), "cb_"+strconv.FormatInt(d.ID, 10), e.cfg.Now(), d.Payload)
	resp, err := e.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is recorded already
		}
		return 0, err
	}
	defer resp.Body.Close()
	readAll(resp.Body, 64<<10)
	return resp.StatusCode, nil
}

// SignCallback sets the headers of a callback: JSON, the callback's stable
// id (webhook-id and Idempotency-Key, the same on every attempt), and the
// signatures the source uses: Standard Webhooks (every secret, for
// rotation) and X-Hub-Signature-256 (the first secret) when the source has
// secrets, Authorization: Bearer (the first token) when it has tokens.
func SignCallback(h http.Header, s Source, id string, now time.Time, body []byte) {
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "vgpu-bridge-callback")
	h.Set(HeaderWebhookID, id)
	h.Set(HeaderIdempotencyKey, id)
	ts := strconv.FormatInt(now.Unix(), 10)
	h.Set(HeaderWebhookTimestamp, ts)
	if len(s.Secrets) > 0 {
		h.Set(HeaderWebhookSignature, StandardSignature(id, ts, body, s.Secrets...))
		h.Set(HeaderHubSignature, HubSignature(s.Secrets[0], body))
	}
	if len(s.Tokens) > 0 {
		h.Set("Authorization", "Bearer "+s.Tokens[0])
	}
}

func (e *Endpoint) recordAttempt(ctx context.Context, d dueCallback, attempt, code int, errText string, dur time.Duration, state string, wait time.Duration) error {
	var codeArg *int
	if code != 0 {
		codeArg = &code
	}
	var errArg *string
	if errText != "" {
		if len(errText) > 1000 {
			errText = errText[:1000]
		}
		errArg = &errText
	}
	ctx = context.WithoutCancel(ctx)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := requests.RecordCallbackAttempt(ctx, tx, requests.CallbackAttempt{Callback: d.ID, Attempt: attempt, StatusCode: codeArg,
		Error: errArg, Duration: dur, State: state, Wait: wait}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
