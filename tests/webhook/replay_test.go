package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
)

// TestSignedBodyActsOnce: X-Hub-Signature-256 covers the body alone, so a
// captured request replayed under a new or missing key is refused (409
// replayed); a retry under its own key still gets the first answer.
// Before the digest was kept, every replay with a fresh Idempotency-Key
// made a new request.
func TestSignedBodyActsOnce(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := []byte(`{"type":"GPU_RELEASE","vm_id":"` + vmID + `"}`)
	first := e.postHub("batch", secretNew, body, "k1")
	e.want202(first)
	for _, key := range []string{"k2", "replay-" + strconv.Itoa(time.Now().Nanosecond()), ""} {
		wantProblem(t, e.postHub("batch", secretNew, body, key), http.StatusConflict, "replayed")
	}
	again := e.postHub("batch", secretNew, body, "k1")
	if again.status != http.StatusAccepted || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry under its own key: %d %s, want the first answer", again.status, again.body)
	}
	// A key freed by a refused replay stays free: it was never used.
	e.want202(e.postHub("batch", secretNew, nativeBody(""), "k2"))
	if n := e.count(`SELECT count(*) FROM requests WHERE kind = 'GPU_RELEASE'`); n != 1 {
		t.Errorf("%d GPU_RELEASE requests stored, want 1", n)
	}
	if got := e.metric("vgpu_bridge_webhook_refused_total", `reason="replayed",source="batch"`); got != 3 {
		t.Errorf("refused{replayed} = %v, want 3", got)
	}

	// GitHub-style senders: X-GitHub-Delivery is the key.
	gh := nativeBody(`"metrics":{"from":"github"}`)
	post := func(delivery string) answer {
		return e.do(http.MethodPost, "/v1/webhooks/batch", gh, map[string]string{
			"X-Hub-Signature-256": hubSign(secretNew, gh), "X-GitHub-Delivery": delivery})
	}
	a := post("72d3162e-cc78-11e3-81ab-4c9367dc0958")
	e.want202(a)
	if b := post("72d3162e-cc78-11e3-81ab-4c9367dc0958"); b.status != http.StatusAccepted || string(b.body) != string(a.body) {
		t.Errorf("GitHub redelivery: %d %s, want the first answer", b.status, b.body)
	}
	wantProblem(t, post("0b9a1f5c-cc79-11e3-81ab-4c9367dc0958"), http.StatusConflict, "replayed")

	// Without any key the body is the guard.
	nokey := nativeBody(`"count":2`)
	e.want202(e.postHub("batch", secretNew, nokey, ""))
	wantProblem(t, e.postHub("batch", secretNew, nokey, ""), http.StatusConflict, "replayed")

	// Standard Webhooks signs its id and timestamp: the same body under a
	// new webhook-id is a new message.
	std := nativeBody(`"count":3`)
	e.want202(e.postStd("batch", secretNew, std, "msg-1", time.Now()))
	e.want202(e.postStd("batch", secretNew, std, "msg-2", time.Now()))

	// Digests are kept as long as keys: once expired the body acts again.
	if _, err := e.pool.Exec(context.Background(), `UPDATE webhook_signed_bodies SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	e.want202(e.postHub("batch", secretNew, body, "k9"))
}

// TestSignedBodyConcurrentReplays: one body sent at once under many keys
// is accepted once.
func TestSignedBodyConcurrentReplays(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := nativeBody("")
	const n = 16
	out := make(chan answer, n)
	for i := range n {
		go func() { out <- e.postHub("batch", secretNew, body, fmt.Sprintf("c%d", i)) }()
	}
	accepted, replayed := 0, 0
	for range n {
		switch a := <-out; {
		case a.status == http.StatusAccepted:
			accepted++
		case a.status == http.StatusConflict && a.json(t)["code"] == "replayed":
			replayed++
		default:
			t.Errorf("answer %d %s", a.status, a.body)
		}
	}
	if accepted != 1 || replayed != n-1 || e.count(`SELECT count(*) FROM requests`) != 1 {
		t.Errorf("accepted %d, replayed %d, stored %d; want 1, %d, 1", accepted, replayed, e.count(`SELECT count(*) FROM requests`), n-1)
	}
	if k := e.count(`SELECT count(*) FROM webhook_idempotency`); k != 1 {
		t.Errorf("%d idempotency keys kept, want 1 (the refused replays' keys stay free)", k)
	}
}

// TestBodyTimestamp: a native body may carry the time it was signed; one
// older (or newer) than the source's tolerance is refused.
func TestBodyTimestamp(t *testing.T) {
	s := batchSource()
	s.TimestampTolerance = time.Minute
	e := newEnv(t, []webhook.Source{s})
	now := time.Now()
	e.want202(e.postHub("batch", secretNew, nativeBody(`"timestamp":"`+now.UTC().Format(time.RFC3339)+`"`), "t1"))
	e.want202(e.postHub("batch", secretNew, nativeBody(`"timestamp":`+strconv.FormatInt(now.Unix(), 10)), "t2"))
	// Beyond what a time.Duration holds (about 292 years) ahead, and the
	// earliest time a body may say, in both forms: refused like any other
	// skew.
	for i, ts := range []string{`"` + now.Add(-2*time.Minute).UTC().Format(time.RFC3339) + `"`, strconv.FormatInt(now.Add(5*time.Minute).Unix(), 10),
		`"` + now.AddDate(300, 0, 0).UTC().Format(time.RFC3339) + `"`, strconv.FormatInt(now.AddDate(300, 0, 0).Unix(), 10),
		`"9999-12-31T23:59:59Z"`, `253402300799`, `"1970-01-01T00:00:00Z"`, `0`} {
		wantProblem(t, e.postHub("batch", secretNew, nativeBody(`"timestamp":`+ts), fmt.Sprintf("t%d", i+3)), http.StatusUnauthorized, "timestamp_skew")
	}
	for i, ts := range []string{`"yesterday"`, `-5`, `1.5`, `true`, `"2026-13-01T00:00:00Z"`} {
		p := wantProblem(t, e.postHub("batch", secretNew, nativeBody(`"timestamp":`+ts), fmt.Sprintf("tb%d", i)), http.StatusUnprocessableEntity, "invalid_params")
		if ip := p["invalid_params"].([]any); len(ip) != 1 || ip[0].(map[string]any)["name"] != "timestamp" {
			t.Errorf("timestamp %s: %v", ts, ip)
		}
	}
}

// TestMetricsOutOfRange422: a metric number a double cannot hold is
// refused as a field (it got 503 "retry" beyond Postgres's numeric range,
// or 202 and a failed request beyond float64's).
func TestMetricsOutOfRange422(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	for i, v := range []string{"1e400", "-1e400", "1e200000", "1e-400"} {
		p := wantProblem(t, e.postHub("batch", secretNew, nativeBody(`"metrics":{"util":`+v+`}`), fmt.Sprintf("m%d", i)),
			http.StatusUnprocessableEntity, "invalid_params")
		if ip := p["invalid_params"].([]any); len(ip) != 1 || ip[0].(map[string]any)["name"] != "metrics.util" {
			t.Errorf("%s: %v", v, ip)
		}
	}
	e.want202(e.postHub("batch", secretNew, nativeBody(`"metrics":{"util":1.5e300,"tiny":-2.5e-300}`), "m-ok"))
	if n := e.count(`SELECT count(*) FROM requests`); n != 1 {
		t.Errorf("%d requests stored, want 1", n)
	}
}

// TestJSONTextChecks: the escaped backslash "\\u0000" is legal text; a
// real \u0000 is not (Postgres cannot store it), nor is a member name
// twice in one object (which one counts is up to the reader), nor bytes
// that are not UTF-8.
func TestJSONTextChecks(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	e.want202(e.postHub("batch", secretNew, nativeBody(`"metrics":{"note":"C:\\u0000dir"}`), "j1"))
	for i, c := range []struct {
		extra  string
		status int
		code   string
		name   string
	}{
		{`"metrics":{"note":"a\u0000b"}`, 422, "invalid_params", "(body)"},
		{`"metrics":{"note":"a\\\u0000b"}`, 422, "invalid_params", "(body)"},
		{`"metrics":{"util":1,"util":2}`, 422, "invalid_params", "metrics.util"},
		{`"workload":"training"`, 422, "invalid_params", "workload"},
		{"\"metrics\":{\"note\":\"a\xffb\"}", 400, "invalid_utf8", ""},
	} {
		p := wantProblem(t, e.postHub("batch", secretNew, nativeBody(c.extra), fmt.Sprintf("j%d", i+2)), c.status, c.code)
		if c.name != "" {
			found := false
			for _, ip := range p["invalid_params"].([]any) {
				found = found || ip.(map[string]any)["name"] == c.name
			}
			if !found {
				t.Errorf("%s: invalid_params %v lack %s", c.extra, p["invalid_params"], c.name)
			}
		}
	}
}

// TestUnauthenticatedSpendsNoSourceBudget: a client flooding a source
// with unsigned requests uses up its own bucket only; the real sender,
// from another address, is not held at 429. Before, the source's bucket
// was taken before authentication.
func TestUnauthenticatedSpendsNoSourceBudget(t *testing.T) {
	s := batchSource()
	s.Rate, s.Burst, s.ClientRate, s.ClientBurst = 0.01, 5, 0.01, 5
	s.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	e := newEnv(t, []webhook.Source{s})
	var wg sync.WaitGroup
	codes := make(chan string, 40)
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := e.do(http.MethodPost, "/v1/webhooks/batch", nativeBody(""), map[string]string{"X-Forwarded-For": "198.51.100.66"})
			codes <- a.json(t)["code"].(string)
		}()
	}
	wg.Wait()
	close(codes)
	got := map[string]int{}
	for c := range codes {
		got[c]++
	}
	if got["missing_signature"] != 5 || got["rate_limited_client"] != 35 {
		t.Errorf("the flood's answers %v, want 5 missing_signature then rate_limited_client", got)
	}
	for i := range 5 {
		body := nativeBody("")
		a := e.do(http.MethodPost, "/v1/webhooks/batch", body, map[string]string{"X-Forwarded-For": "192.0.2.10",
			"X-Hub-Signature-256": hubSign(secretNew, body), "Idempotency-Key": fmt.Sprintf("legit-%d", i)})
		e.want202(a)
	}
}
