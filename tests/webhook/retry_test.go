package webhook

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
)

// TestReplayedNamesFirstRequest: a signed body sent again without a key
// (or under another) is refused 409 replayed, and the refusal names the
// request the body made (first_request_id, status_url) so that a sender
// retrying without a key can follow it; so does every copy of a body
// sent many times at once.
func TestReplayedNamesFirstRequest(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := nativeBody("")
	id := e.want202(e.postHub("batch", secretNew, body, ""))
	for _, key := range []string{"", "other"} {
		p := wantProblem(t, e.postHub("batch", secretNew, body, key), http.StatusConflict, "replayed")
		if p["first_request_id"] != id.String() || p["status_url"] != "/v1/requests/"+id.String() {
			t.Errorf("replayed under key %q: %v, want first_request_id %s and its status_url", key, p, id)
		}
	}
	// What it names, the source reads with its own credentials.
	path := "/v1/requests/" + id.String()
	if a := e.do(http.MethodGet, path, nil, map[string]string{
		"X-Hub-Signature-256": hubSign(secretNew, []byte("GET "+path))}); a.status != http.StatusOK {
		t.Errorf("the source reading the named request: %d %s", a.status, a.body)
	}

	// At once: each refused copy names the one accepted.
	conc := nativeBody("")
	const n = 8
	out := make(chan answer, n)
	for i := range n {
		go func() { out <- e.postHub("batch", secretNew, conc, fmt.Sprintf("c%d", i)) }()
	}
	var accepted string
	var named []any
	for range n {
		a := <-out
		switch a.status {
		case http.StatusAccepted:
			accepted = a.json(t)["request_id"].(string)
		case http.StatusConflict:
			named = append(named, a.json(t)["first_request_id"])
		default:
			t.Errorf("answer %d %s", a.status, a.body)
		}
	}
	for _, f := range named {
		if f != accepted {
			t.Errorf("a concurrent copy named %v, want the accepted %s", f, accepted)
		}
	}
}

// TestEventIDIsTheKey: a sender whose scheme carries no key (a bearer
// token here) names the event in the body; a retry of the same body gets
// the first answer instead of making a second request, another body under
// the same event_id is a conflict, and an unusable event_id is refused.
func TestEventIDIsTheKey(t *testing.T) {
	src := webhook.Source{Name: "bearer", Auth: webhook.AuthBearer, Format: webhook.FormatNative,
		Tokens: []string{amToken}, Rate: 1000, Burst: 1000, MaxBodyBytes: 4096}
	e := newEnv(t, []webhook.Source{src})
	post := func(body []byte) answer {
		return e.do(http.MethodPost, "/v1/webhooks/bearer", body, map[string]string{"Authorization": "Bearer " + amToken})
	}
	body := nativeBody(`"event_id":"job-4711/attempt-1"`)
	first := post(body)
	e.want202(first)
	again := post(body)
	if again.status != http.StatusAccepted || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry with the same event_id: %d %s, want the first answer, replayed", again.status, again.body)
	}
	if n := e.count(`SELECT count(*) FROM requests`); n != 1 {
		t.Errorf("%d requests stored, want 1", n)
	}
	wantProblem(t, post(nativeBody(`"event_id":"job-4711/attempt-1","count":2`)), http.StatusConflict, "idempotency_conflict")
	// The header, when sent, is the key.
	h := e.do(http.MethodPost, "/v1/webhooks/bearer", nativeBody(`"event_id":"job-4711/attempt-1","count":3`),
		map[string]string{"Authorization": "Bearer " + amToken, "Idempotency-Key": "hdr-1"})
	e.want202(h)
	p := wantProblem(t, post(nativeBody(`"event_id":"has space"`)), http.StatusUnprocessableEntity, "invalid_params")
	if fmt.Sprint(p["invalid_params"]) != "[map[name:event_id reason:must be 1 to 255 printable ASCII characters]]" {
		t.Errorf("invalid_params %v", p["invalid_params"])
	}
}
