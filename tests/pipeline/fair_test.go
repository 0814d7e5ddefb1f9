package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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
// by a member of A, and a webhook source for A's instances: 480 events,
// many batches), the pipeline is through part of it, and project B then
// makes ten requests. Each of B's requests is decided before more than K
// (the documented [pipeline] project_share) of A's waiting backlog: the
// pipeline's batches take at most K events of a project, the projects
// taking turns. Before, a batch was the oldest events, so B's requests
// waited for the whole backlog. It asserts the order of the decisions
// (decisions.id), not times.
func TestFairBetweenProjects(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r := w.startBridge(replicaOpts{name: "fair", noRun: true}) // the test runs the polls
	k := pipeline.DefaultConfig().ProjectShare
	if b := pipeline.DefaultConfig().BatchSize; k >= b {
		t.Fatalf("project_share %d is not below batch_size %d: nothing to test", k, b)
	}
	projB := "b" + w.project[1:]
	var instA, instB []string
	for i := range 40 {
		instA = append(instA, uuid.NewString())
		if i < 3 {
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
	url := w.serveRequests(map[string]string{"member-a": "member alice " + w.project, "member-b": "member bob " + projB})

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
	for range 2 {
		_, err := r.proc.ProcessOnce(w.ctx)
		testsvc.Must(t, err, "process")
	}
	var mark int64
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(max(id), 0) FROM decisions`).Scan(&mark), "decisions so far")
	var waiting int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM events WHERE processed_at IS NULL`).Scan(&waiting), "backlog")
	if waiting < 4*k {
		t.Fatalf("only %d of A's events still wait: the flood is too small to tell", waiting)
	}
	var quiet []uuid.UUID
	for i := range 10 {
		id, err := w.postRequest(url, "member-b", instB[i%len(instB)])
		testsvc.Must(t, err, "B's request")
		quiet = append(quiet, id)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := r.proc.ProcessOnce(w.ctx)
		testsvc.Must(t, err, "process")
		var left int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM events WHERE processed_at IS NULL`).Scan(&left), "backlog")
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events still wait", left)
		}
		if n == 0 {
			time.Sleep(50 * time.Millisecond) // a retry's backoff
		}
	}

	// The decisions after B asked, in order.
	rows, err := w.pool.Query(w.ctx, `SELECT request_id FROM decisions WHERE id > $1 AND request_id IS NOT NULL ORDER BY id`, mark)
	testsvc.Must(t, err, "decisions")
	var order []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		testsvc.Must(t, rows.Scan(&id), "scan")
		order = append(order, id)
	}
	testsvc.Must(t, rows.Err(), "decisions")
	floodBefore := map[uuid.UUID]int{}
	seen := 0
	for _, id := range order {
		if _, ok := flood.Load(id); ok {
			seen++
		} else {
			floodBefore[id] = seen
		}
	}
	var before []int
	for _, id := range quiet {
		before = append(before, floodBefore[id])
	}
	t.Logf("K = %d; %d of A's events waited when B asked; A's decisions before each of B's: %v", k, waiting, before)
	for i, id := range quiet {
		n, ok := floodBefore[id]
		switch {
		case !ok:
			t.Errorf("B's request %d (%s) was not decided", i, id)
		case n > k:
			t.Errorf("B's request %d was decided after %d of A's backlog, more than K = %d", i, n, k)
		}
	}
	var undecided int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM requests r WHERE NOT EXISTS (SELECT 1 FROM decisions d WHERE d.request_id = r.id)`).Scan(&undecided), "undecided")
	if undecided != 0 {
		t.Errorf("%d requests without a decision", undecided)
	}
}

// serveRequests starts the operator API's POST /v1/requests and a webhook
// source "flood" (bearer token "flood-token-0123456789") over the world's
// database; tokens are "TOKEN" → "ROLE NAME PROJECT" lines.
func (w *world) serveRequests(tokens map[string]string) string {
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
	ep, err := webhook.New(webhook.Config{Store: requests.NewStore(w.pool, "test"), Pool: w.pool,
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
		return uuid.Nil, fmt.Errorf("POST %s: %s", url, resp.Status)
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
