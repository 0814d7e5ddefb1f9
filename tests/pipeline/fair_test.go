package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestFairBetweenProjects: project A floods the inbox (POST /v1/requests
// by a member of A, and a webhook source for A's instances: 480 events),
// the pipeline is deciding them, and project B then makes ten requests.
// Each of B's requests is decided before more than K (the documented
// [pipeline] project_share) of A's backlog: the pipeline's workers take the
// projects' events in turns, and it looks at the inbox again when a commit
// wakes it. Before, a batch was the oldest events, so B's requests waited
// for the whole backlog. It asserts the order of the decisions
// (decisions.id), not times.
func TestFairBetweenProjects(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.startBridge(replicaOpts{name: "fair", noRun: true}) // the pipeline runs once the flood is in
	k := pipeline.DefaultConfig().ProjectShare
	// Another project's id, never the world's (a prefix swap was the
	// world's own id whenever that began with the swapped-in letter: B's
	// instances then replaced A's, and A's flood was refused 403).
	projB := strings.ReplaceAll(uuid.NewString(), "-", "")
	var instA, instB []string
	for i := range 40 {
		instA = append(instA, uuid.NewString())
		if i < 10 {
			instB = append(instB, uuid.NewString())
		}
	}
	for proj, insts := range map[string][]string{w.project: instA, projB: instB} {
		for _, inst := range insts {
			_, err := w.pool.Exec(w.ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
				VALUES ($1, $2, $3, $4, $5, 'active', 'running')`, inst, proj, w.user, w.host, w.node)
			testsvc.Must(t, err, "instance row")
		}
	}
	url := w.serveRequests(map[string]string{"member-a": "member alice " + w.project, "member-b": "member bob " + projB}, r.proc.Wake)

	// A's flood: 240 through the API and 240 webhooks, 16 at a time.
	const perRoute = 240
	var flood sync.Map // request id → true
	var wg sync.WaitGroup
	var failed sync.Once
	var floodErr error
	jobs := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range jobs {
				inst := instA[i%len(instA)]
				post := func() (uuid.UUID, error) { return w.postRequest(url, "member-a", inst) }
				if i%2 == 1 {
					post = func() (uuid.UUID, error) { return w.postHook(url, inst) }
				}
				id, err := post()
				if err != nil {
					failed.Do(func() { floodErr = err })
					continue
				}
				flood.Store(id, true)
			}
		})
	}
	for i := range 2 * perRoute {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	testsvc.Must(t, floodErr, "A's flood")
	if n := len(syncMapKeys(&flood)); n != 2*perRoute {
		t.Fatalf("%d distinct requests of A's flood, want %d", n, 2*perRoute)
	}

	// The pipeline works through part of the backlog, then B asks.
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- r.proc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	decided := func() (last int64, n int) {
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(max(id), 0), count(*) FROM decisions`).Scan(&last, &n), "decisions so far")
		return last, n
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if _, n := decided(); n >= 2*k {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pipeline did not start on A's backlog")
		}
	}
	type asked struct {
		id   uuid.UUID
		mark int64 // the last decision when it was accepted
	}
	var quiet []asked
	waiting := 0
	for i := range 10 {
		id, err := w.postRequest(url, "member-b", instB[i%len(instB)])
		testsvc.Must(t, err, "B's request")
		mark, n := decided()
		if i == 0 {
			waiting = 2*perRoute - n
		}
		quiet = append(quiet, asked{id, mark})
	}
	if waiting < 4*k {
		t.Fatalf("only %d of A's events waited when B asked: the flood is too small to tell", waiting)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, n := decided(); n == 2*perRoute+len(quiet) {
			break
		}
		if time.Now().After(deadline) {
			_, n := decided()
			t.Fatalf("%d of %d requests decided", n, 2*perRoute+len(quiet))
		}
	}

	// A's decisions between each of B's requests and its decision.
	var before []int
	for i, q := range quiet {
		var n int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM decisions f
			WHERE f.id > $1 AND f.id < (SELECT id FROM decisions WHERE request_id = $2)
			  AND f.request_id::text = ANY($3)`, q.mark, q.id, floodIDs(&flood)).Scan(&n), "order")
		before = append(before, n)
		if n > k {
			t.Errorf("B's request %d was decided after %d of A's backlog, more than K = %d", i, n, k)
		}
	}
	t.Logf("K = %d; %d of A's events waited when B asked; A's decisions before each of B's: %v", k, waiting, before)
}

// serveRequests starts the operator API's POST /v1/requests and a webhook
// source "flood" (bearer token "flood-token-0123456789") over the world's
// database, calling onCommitted after each commit as the bridge wakes its
// pipeline; tokens are "TOKEN" → "ROLE NAME PROJECT" lines.
func (w *world) serveRequests(tokens map[string]string, onCommitted func()) string {
	t := w.t
	tf := filepath.Join(t.TempDir(), "api-tokens")
	var b bytes.Buffer
	for tok, line := range tokens {
		fmt.Fprintf(&b, "%s %s\n", tok, line)
	}
	testsvc.Must(t, os.WriteFile(tf, b.Bytes(), 0o600), "token file")
	auth, err := api.LoadTokenFile(tf)
	testsvc.Must(t, err, "token file")
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: auth})
	ep, err := webhook.New(webhook.Config{Store: requests.NewStore(w.pool, "test"), Pool: w.pool, OnCommitted: onCommitted,
		Sources: []webhook.Source{{Name: "flood", Auth: webhook.AuthBearer, Tokens: []string{"flood-token-0123456789"},
			Rate: 1e6, Burst: 1e6}}})
	testsvc.Must(t, err, "webhook endpoint")
	ep.Register(srv)
	ep.RegisterOperator(srv)
	testsvc.Must(t, srv.Start(), "start API")
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { ep.Run(ctx); close(done) }()
	t.Cleanup(func() { srv.Shutdown(); cancel(); <-done })
	return "http://" + srv.Addr()
}

func loadBody(inst string) []byte {
	return []byte(`{"type":"GPU_LOAD","vm_id":"` + inst + `","workload":"training","metrics":{"util":0.5},"nonce":"` + uuid.NewString() + `"}`)
}

// post sends a GPU_LOAD for inst to url and returns the request's id; it
// may run in any goroutine.
func (w *world) post(url, auth, inst string) (uuid.UUID, error) {
	req, err := http.NewRequestWithContext(w.ctx, http.MethodPost, url, bytes.NewReader(loadBody(inst)))
	if err != nil {
		return uuid.Nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return uuid.Nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return uuid.Nil, fmt.Errorf("POST %s for %s: %s: %s", url, inst, resp.Status, body)
	}
	var a struct {
		RequestID uuid.UUID `json:"request_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return uuid.Nil, err
	}
	if a.RequestID == uuid.Nil {
		return uuid.Nil, fmt.Errorf("POST %s: no request_id", url)
	}
	return a.RequestID, nil
}

func (w *world) postRequest(url, token, inst string) (uuid.UUID, error) {
	return w.post(url+"/v1/requests", token, inst)
}

func (w *world) postHook(url, inst string) (uuid.UUID, error) {
	return w.post(url+"/v1/webhooks/flood", "flood-token-0123456789", inst)
}

func syncMapKeys(m *sync.Map) []any {
	var out []any
	m.Range(func(k, _ any) bool { out = append(out, k); return true })
	return out
}

func floodIDs(m *sync.Map) []string {
	var out []string
	m.Range(func(k, _ any) bool { out = append(out, k.(uuid.UUID).String()); return true })
	return out
}
