package webhook

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Each refusal of the webhook endpoint, one test each, against the real server.

func TestRefuseUnknownSource404(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := nativeBody("")
	a := e.postHub("no-such-source", secretNew, body, "k1")
	wantProblem(t, a, http.StatusNotFound, "unknown_source")
	if got := e.metric("vgpu_bridge_webhook_refused_total", `reason="unknown_source",source="(unknown)"`); got != 1 {
		t.Errorf("refused metric = %v, want 1", got)
	}
	if !strings.Contains(e.logs.String(), `"reason":"unknown_source"`) {
		t.Errorf("refusal not logged with its reason")
	}
}

func TestRefuseAddress403(t *testing.T) {
	s := batchSource()
	s.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	e := newEnv(t, []webhook.Source{s})
	a := e.postHub("batch", secretNew, nativeBody(""), "k1")
	wantProblem(t, a, http.StatusForbidden, "address_not_allowed")
	// The log names source, address and reason.
	l := e.logs.String()
	for _, want := range []string{`"source":"batch"`, `"remote":"127.0.0.1"`, `"reason":"address_not_allowed"`} {
		if !strings.Contains(l, want) {
			t.Errorf("log lacks %s", want)
		}
	}
	if got := e.metric("vgpu_bridge_webhook_refused_total", `reason="address_not_allowed",source="batch"`); got != 1 {
		t.Errorf("metric = %v", got)
	}
}

func TestAllowedAddressAndTrustedProxy(t *testing.T) {
	s := batchSource()
	s.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	s.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	e := newEnv(t, []webhook.Source{s})
	body := nativeBody("")
	h := map[string]string{"X-Hub-Signature-256": hubSign(secretNew, body), "Idempotency-Key": "xff-1"}
	// The loopback peer is a trusted proxy: the client is the XFF hop.
	h["X-Forwarded-For"] = "203.0.113.9, 192.0.2.77"
	e.want202(e.do(http.MethodPost, "/v1/webhooks/batch", body, h))
	h["X-Forwarded-For"] = "192.0.2.77, 203.0.113.9"
	h["Idempotency-Key"] = "xff-2"
	wantProblem(t, e.do(http.MethodPost, "/v1/webhooks/batch", body, h), http.StatusForbidden, "address_not_allowed")
}

func TestRefuseRate429(t *testing.T) {
	s := batchSource()
	s.Rate, s.Burst = 0.01, 2 // two at once, then one per 100 s
	s.ClientRate, s.ClientBurst = 1000, 1000
	e := newEnv(t, []webhook.Source{s})
	for i := range 2 {
		e.want202(e.postHub("batch", secretNew, nativeBody(""), fmt.Sprintf("r%d", i)))
	}
	a := e.postHub("batch", secretNew, nativeBody(""), "r3")
	wantProblem(t, a, http.StatusTooManyRequests, "rate_limited_source")
	ra, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 101 {
		t.Errorf("Retry-After = %q, want 1..101 seconds", a.header.Get("Retry-After"))
	}
}

func TestRefuseRatePerClient429(t *testing.T) {
	s := batchSource()
	s.ClientRate, s.ClientBurst = 0.01, 1
	s.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	e := newEnv(t, []webhook.Source{s})
	post := func(client, key string) answer {
		body := nativeBody("")
		return e.do(http.MethodPost, "/v1/webhooks/batch", body, map[string]string{
			"X-Hub-Signature-256": hubSign(secretNew, body), "Idempotency-Key": key, "X-Forwarded-For": client})
	}
	e.want202(post("192.0.2.1", "c1"))
	a := post("192.0.2.1", "c2")
	wantProblem(t, a, http.StatusTooManyRequests, "rate_limited_client")
	if a.header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	// Another client has its own bucket.
	e.want202(post("192.0.2.2", "c3"))
}

func TestRefuseContentType415(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := nativeBody("")
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/jsonx", ""} {
		h := map[string]string{"X-Hub-Signature-256": hubSign(secretNew, body), "Idempotency-Key": "ct", "Content-Type": ct}
		req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/webhooks/batch", strings.NewReader(string(body)))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		if ct == "" {
			req.Header.Del("Content-Type")
		}
		resp, err := e.client().Do(req)
		testsvc.Must(t, err, "post")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantProblem(t, answer{resp.StatusCode, resp.Header, b}, http.StatusUnsupportedMediaType, "unsupported_media_type")
	}
	// Parameters are fine.
	e.want202(e.do(http.MethodPost, "/v1/webhooks/batch", body, map[string]string{
		"X-Hub-Signature-256": hubSign(secretNew, body), "Idempotency-Key": "ct-ok", "Content-Type": "application/json; charset=utf-8"}))
}

func TestRefuseTooBig413(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()}) // max 4096 bytes
	big := nativeBody(`"metrics":{"pad":"` + strings.Repeat("x", 900) + `","pad2":"` + strings.Repeat("y", 900) +
		`","pad3":"` + strings.Repeat("z", 900) + `","pad4":"` + strings.Repeat("w", 900) + `","pad5":"` + strings.Repeat("v", 900) + `"}`)
	a := e.postHub("batch", secretNew, big, "big")
	wantProblem(t, a, http.StatusRequestEntityTooLarge, "body_too_large")
}

// TestRefuseTooBigWhileReading streams a chunked body without
// Content-Length over a raw connection and keeps the stream open: the 413
// must come once the limit is passed, not after the end of the body.
func TestRefuseTooBigWhileReading(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()}) // max 4096 bytes
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	testsvc.Must(t, err, "dial")
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/webhooks/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"X-Hub-Signature-256: %s\r\nIdempotency-Key: stream\r\nTransfer-Encoding: chunked\r\n\r\n", hubSign(secretNew, nil))
	chunk := strings.Repeat(" ", 1024)
	for range 6 { // 6 KiB, more than the limit; the body never ends
		fmt.Fprintf(conn, "%x\r\n%s\r\n", len(chunk), chunk)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer while the body was still streaming (%v): the limit is not enforced while reading", err)
	}
	b, _ := io.ReadAll(resp.Body)
	wantProblem(t, answer{resp.StatusCode, resp.Header, b}, http.StatusRequestEntityTooLarge, "body_too_large")
}

func TestRefuseUnauthorized401(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := nativeBody("")
	now := time.Now()
	ts := strconv.FormatInt(now.Unix(), 10)
	cases := []struct {
		name string
		h    map[string]string
		code string
	}{
		{"no signature", map[string]string{"Idempotency-Key": "a1"}, "missing_signature"},
		{"hub wrong secret", map[string]string{"X-Hub-Signature-256": hubSign(secretOther, body), "Idempotency-Key": "a2"}, "bad_signature"},
		{"hub malformed", map[string]string{"X-Hub-Signature-256": "sha1=abcd", "Idempotency-Key": "a3"}, "bad_signature"},
		{"hub over another body", map[string]string{"X-Hub-Signature-256": hubSign(secretNew, append(body, ' ')), "Idempotency-Key": "a4"}, "bad_signature"},
		{"std wrong secret", map[string]string{"webhook-id": "m1", "webhook-timestamp": ts, "webhook-signature": stdSign(secretOther, "m1", ts, body)}, "bad_signature"},
		{"std id not signed", map[string]string{"webhook-id": "m2", "webhook-timestamp": ts, "webhook-signature": stdSign(secretNew, "m1", ts, body)}, "bad_signature"},
		{"std missing timestamp", map[string]string{"webhook-id": "m3", "webhook-signature": stdSign(secretNew, "m3", ts, body)}, "missing_signature"},
		{"std bad timestamp", map[string]string{"webhook-id": "m4", "webhook-timestamp": "soon", "webhook-signature": stdSign(secretNew, "m4", "soon", body)}, "bad_timestamp"},
		{"std garbage signature", map[string]string{"webhook-id": "m5", "webhook-timestamp": ts, "webhook-signature": "v1,!!!"}, "bad_signature"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantProblem(t, e.do(http.MethodPost, "/v1/webhooks/batch", body, c.h), http.StatusUnauthorized, c.code)
		})
	}
	if n := e.count(`SELECT count(*) FROM requests`); n != 0 {
		t.Errorf("%d requests stored after refusals", n)
	}
	e.noSecretsLogged()
}

func TestRefuseBearer401(t *testing.T) {
	e := newEnv(t, []webhook.Source{alertSource()})
	body := []byte(`{"version":"4","status":"firing","alerts":[]}`)
	for name, h := range map[string]map[string]string{
		"none":  {},
		"wrong": {"Authorization": "Bearer not-the-token-at-all"},
	} {
		t.Run(name, func(t *testing.T) {
			a := e.do(http.MethodPost, "/v1/webhooks/alerts", body, h)
			wantProblem(t, a, http.StatusUnauthorized, map[string]string{"none": "missing_token", "wrong": "bad_token"}[name])
			if a.header.Get("WWW-Authenticate") == "" {
				t.Error("no WWW-Authenticate")
			}
		})
	}
	e.noSecretsLogged()
}

func TestRefuseNotJSON400(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	for i, body := range []string{`{"type":`, `not json`, `{"a":1}{"b":2}`, "\xff\xfe"} {
		a := e.postHub("batch", secretNew, []byte(body), fmt.Sprintf("nj%d", i))
		wantProblem(t, a, http.StatusBadRequest, "not_json")
	}
}

func TestRefuseSchema422(t *testing.T) {
	s := batchSource()
	s.CallbackHosts = []string{"scheduler.example.org"}
	e := newEnv(t, []webhook.Source{s})
	body := []byte(`{"type":"GPU_GIVE","vm_id":"not-a-uuid","workload":"mining","vgpu_profile":"T4 4Q!","count":99,` +
		`"metrics":{"util":[1,2]},"callback_url":"http://169.254.169.254/latest/meta-data","colour":"blue"}`)
	a := e.postHub("batch", secretNew, body, "schema")
	p := wantProblem(t, a, http.StatusUnprocessableEntity, "invalid_params")
	got := map[string]bool{}
	for _, ip := range p["invalid_params"].([]any) {
		got[ip.(map[string]any)["name"].(string)] = true
	}
	for _, want := range []string{"type", "vm_id", "workload", "vgpu_profile", "count", "metrics.util", "callback_url", "colour"} {
		if !got[want] {
			t.Errorf("invalid_params lacks %s: %s", want, a.body)
		}
	}
	// Wrong types are named too, and a missing required field.
	a = e.postHub("batch", secretNew, []byte(`{"type":7,"count":"one","metrics":[]}`), "schema2")
	p = wantProblem(t, a, http.StatusUnprocessableEntity, "invalid_params")
	got = map[string]bool{}
	for _, ip := range p["invalid_params"].([]any) {
		got[ip.(map[string]any)["name"].(string)] = true
	}
	for _, want := range []string{"type", "vm_id", "count", "metrics"} {
		if !got[want] {
			t.Errorf("invalid_params lacks %s: %s", want, a.body)
		}
	}
	// Not an object.
	wantProblem(t, e.postHub("batch", secretNew, []byte(`[1,2]`), "schema3"), http.StatusUnprocessableEntity, "invalid_params")
	// A bad Idempotency-Key is named like a field.
	a = e.postHub("batch", secretNew, nativeBody(""), "has space")
	wantProblem(t, a, http.StatusUnprocessableEntity, "invalid_params")
	if !strings.Contains(string(a.body), "Idempotency-Key") {
		t.Errorf("bad key not named: %s", a.body)
	}
}

func TestIdempotencyConflict409AndReplay(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := nativeBody("")
	first := e.postHub("batch", secretNew, body, "job-42")
	id := e.want202(first)
	// Same key, same body: the first answer again, nothing new stored.
	again := e.postHub("batch", secretNew, body, "job-42")
	if again.status != http.StatusAccepted || string(again.body) != string(first.body) {
		t.Fatalf("retry answered %d %s, want the first answer %s", again.status, again.body, first.body)
	}
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Error("replay not marked")
	}
	// Same key, another body: 409.
	wantProblem(t, e.postHub("batch", secretNew, nativeBody(`"metrics":{"util":0.5}`), "job-42"), http.StatusConflict, "idempotency_conflict")
	// The webhook-id of Standard Webhooks is a key of the same space.
	a := e.postStd("batch", secretNew, nativeBody(`"metrics":{"util":0.5}`), "job-42", time.Now())
	wantProblem(t, a, http.StatusConflict, "idempotency_conflict")
	if n := e.count(`SELECT count(*) FROM requests`); n != 1 {
		t.Errorf("%d requests, want 1 (%s)", n, id)
	}
	// Keys are per source.
	s2 := batchSource()
	s2.Name = "batch2"
	e2 := newEnvDB(t, testsvc.MigratedPostgres(t), []webhook.Source{batchSource(), s2})
	e2.want202(e2.postHub("batch", secretNew, nativeBody(""), "shared"))
	e2.want202(e2.postHub("batch2", secretNew, nativeBody(`"count":2`), "shared"))
	// An expired key is free again.
	if _, err := e.pool.Exec(context.Background(), `UPDATE webhook_idempotency SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	e.want202(e.postHub("batch", secretNew, nativeBody(`"count":3`), "job-42"))
}

// TestIdempotencyConcurrent sends the same key at once from many clients:
// one request is stored, every same-body answer is the first, every
// other-body answer is 409.
func TestIdempotencyConcurrent(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	const n = 24
	out := make(chan answer, n)
	same, other := nativeBody(""), nativeBody(`"count":2`)
	for i := range n {
		go func() {
			body := same
			if i%3 == 2 {
				body = other
			}
			out <- e.postHub("batch", secretNew, body, "same-key")
		}()
	}
	ids := map[string]int{}
	conflicts := 0
	for range n {
		a := <-out
		switch a.status {
		case http.StatusAccepted:
			ids[a.json(t)["request_id"].(string)]++
		case http.StatusConflict:
			conflicts++
		default:
			t.Fatalf("answer %d %s", a.status, a.body)
		}
	}
	if len(ids) != 1 {
		t.Errorf("request ids %v, want one", ids)
	}
	if c := e.count(`SELECT count(*) FROM requests`); c != 1 {
		t.Errorf("%d requests stored, want 1", c)
	}
	for _, c := range ids {
		if c+conflicts != n {
			t.Errorf("%d accepted + %d conflicts != %d", c, conflicts, n)
		}
	}
}

// TestCheckOrder sends requests that fail several checks: the first check
// of the endpoint's order of checks answers.
func TestCheckOrder(t *testing.T) {
	s := batchSource()
	s.Rate, s.Burst, s.ClientRate, s.ClientBurst = 0.001, 1, 1000, 1000
	limited := s
	limited.Name = "limited"
	climited := batchSource()
	climited.Name, climited.ClientRate, climited.ClientBurst = "climited", 0.001, 1
	open := batchSource()
	e := newEnv(t, []webhook.Source{limited, climited, open})
	// Use up "limited"'s only token, and this client's only one at
	// "climited".
	e.want202(e.postHub("limited", secretNew, nativeBody(""), "o0"))
	e.want202(e.postHub("climited", secretNew, nativeBody(""), "o0"))
	garbage := []byte(`{"type":`)
	big := []byte(strings.Repeat(" ", 5000) + "{}")
	cases := []struct {
		name, source, ct string
		body             []byte
		h                map[string]string
		status           int
		code             string
	}{
		{"unknown source beats everything", "nope", "text/plain", big, nil, 404, "unknown_source"},
		{"client rate beats content type", "climited", "text/plain", big, nil, 429, "rate_limited_client"},
		{"content type beats size", "batch", "text/plain", big, nil, 415, "unsupported_media_type"},
		{"size beats auth", "batch", "application/json", big, nil, 413, "body_too_large"},
		// The source's budget is spent only by authenticated requests.
		{"auth beats source rate", "limited", "application/json", []byte("nope"), nil, 401, "missing_signature"},
		{"source rate beats JSON", "limited", "application/json", garbage, map[string]string{"X-Hub-Signature-256": hubSign(secretNew, garbage), "Idempotency-Key": "o1"}, 429, "rate_limited_source"},
		{"auth beats JSON", "batch", "application/json", []byte("nope"), nil, 401, "missing_signature"},
		{"JSON beats schema", "batch", "application/json", garbage, map[string]string{"X-Hub-Signature-256": hubSign(secretNew, garbage), "Idempotency-Key": "o1"}, 400, "not_json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{"Content-Type": c.ct}
			for k, v := range c.h {
				h[k] = v
			}
			wantProblem(t, e.do(http.MethodPost, "/v1/webhooks/"+c.source, c.body, h), c.status, c.code)
		})
	}
	// Schema beats idempotency: an invalid body with a used key is 422.
	e.want202(e.postHub("batch", secretNew, nativeBody(""), "o2"))
	wantProblem(t, e.postHub("batch", secretNew, []byte(`{"type":"X"}`), "o2"), 422, "invalid_params")
}

// TestStoreDown: with the database gone, no 202 — a 503 with Retry-After.
func TestStoreDown503(t *testing.T) {
	url := testsvc.MigratedPostgres(t)
	e := newEnvDB(t, url, []webhook.Source{batchSource()})
	e.want202(e.postHub("batch", secretNew, nativeBody(""), "before"))
	// Drop this test's own database under the running endpoint.
	admin := testsvc.Pool(t, testsvc.PostgresAdminURL())
	name := url[strings.LastIndex(url, "/")+1:]
	if i := strings.Index(name, "?"); i >= 0 {
		name = name[:i]
	}
	if _, err := admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	a := e.postHub("batch", secretNew, nativeBody(""), "after")
	wantProblem(t, a, http.StatusServiceUnavailable, "store_unavailable")
	if a.header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
}
