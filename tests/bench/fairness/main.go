// Command fairness is the load harness of fairness between projects (make
// bench): how long a quiet project's requests wait to be decided while
// another project floods the inbox.
//
// In this process, over the local Postgres: the operator API's
// POST /v1/requests and a webhook source (the real endpoint, group
// commit), and the pipeline with its default [pipeline] settings
// (batch_size 100, project_share 25, 4 workers), woken by each commit as
// in the bridge. The policy evaluates a load rule on every GPU_LOAD that
// never acts, so each request is decided (a decisions row) without
// Placement or agents: what is measured is the pipeline's scheduling, not
// the direct path (tests/bench/e2e measures that). The per-project rate
// limit ([api] project_rate) is off, so that the flood reaches the inbox:
// the pipeline must be fair on its own.
//
// Each of -runs runs (3), on a database of its own, measures
//
//  1. quiet alone: project B sends -quiet requests (100), open loop at
//     -quiet-rate (25/s), half through POST /v1/requests and half
//     through the webhook; each one's decision time is from the commit
//     of the request (requests.created_at) to the transaction that
//     decided it (decisions.created_at), both Postgres's clock;
//  2. quiet behind a flood: project A sends -flood requests (6,000) as
//     fast as 32 clients go, over both routes, and once they are all in
//     (the pipeline deciding them, the rest waiting in the inbox), B
//     sends as in (1). What the flood's accepting costs the machine is not
//     what is measured: on 2 shared cores it slows everything alike.
//
// and prints B's p50 and p99 decision time in each, the ratio of the p99s
// (target ≤ 2), the backlog A left in the inbox when B's last request
// was decided, and the medians of the runs.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/bench/benchkit"
)

const (
	projA, projB = "proj-flood", "proj-quiet"
	hookToken    = "bench-fairness-token-0123456789"
	// The rule reads the load and never holds: every GPU_LOAD is
	// evaluated and decided with no action.
	benchPolicy = `version: 1
defaults:
  attach_mode: direct-live
rules:
  - name: busy
    on: [webhook.GPU_LOAD]
    when: has(event.metrics.util) && event.metrics.util > 2.0
    then: ['attach(preferred, 1)']
`
)

func main() {
	runs := flag.Int("runs", 3, "runs (each on a database of its own)")
	flood := flag.Int("flood", 6000, "project A's requests in the flood")
	quiet := flag.Int("quiet", 100, "project B's requests in each phase")
	quietRate := flag.Float64("quiet-rate", 25, "project B's requests per second")
	flag.Parse()
	var all []figures
	for i := range *runs {
		f, err := run(*flood, *quiet, *quietRate)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench fairness:", err)
			os.Exit(1)
		}
		fmt.Printf("run %d: quiet alone p50 %s p99 %s; under a flood of %d: p50 %s p99 %s (A's backlog %d when B's last was accepted); p99 ratio %.2f\n",
			i+1, ms(f.aloneP50), ms(f.aloneP99), *flood, ms(f.floodP50), ms(f.floodP99), f.backlog, f.ratio)
		all = append(all, f)
	}
	med := func(get func(figures) float64) float64 { return benchkit.Median(all, get) }
	fmt.Printf("median of %d: quiet project's decision time alone p50 %s p99 %s; under the flood p50 %s p99 %s; p99 under the flood / alone = %.2f (target ≤ 2)\n",
		len(all), ms(med(func(f figures) float64 { return f.aloneP50 })), ms(med(func(f figures) float64 { return f.aloneP99 })),
		ms(med(func(f figures) float64 { return f.floodP50 })), ms(med(func(f figures) float64 { return f.floodP99 })),
		med(func(f figures) float64 { return f.ratio }))
}

func ms(s float64) string { return fmt.Sprintf("%.1f ms", s*1000) }

type figures struct {
	aloneP50, aloneP99, floodP50, floodP99, ratio float64
	backlog                                       int
}

// noPlacement is the pipeline's Placement: the bench's policy never
// claims, so no call reaches it.
type noPlacement struct{ pipeline.Placement }

func run(flood, quiet int, quietRate float64) (figures, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	dbURL, pool, dropDB, err := benchkit.MigratedDB(ctx, benchkit.AdminURL(), "fair", 16)
	if err != nil {
		return figures{}, err
	}
	defer dropDB()
	instA, err := instances(ctx, pool, projA, 200)
	if err != nil {
		return figures{}, err
	}
	instB, err := instances(ctx, pool, projB, 10)
	if err != nil {
		return figures{}, err
	}

	dir, err := os.MkdirTemp("", "vgpu-bench-fairness-")
	if err != nil {
		return figures{}, err
	}
	defer os.RemoveAll(dir)
	rules, tokens := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "tokens")
	if err := os.WriteFile(rules, []byte(benchPolicy), 0o600); err != nil {
		return figures{}, err
	}
	if err := os.WriteFile(tokens, []byte("member-a member alice "+projA+"\nmember-b member bob "+projB+"\n"), 0o600); err != nil {
		return figures{}, err
	}
	holder, err := policy.NewHolder(policy.Config{RulesFile: rules, ProfilesFile: filepath.Join(repoRoot(), "etc", "vgpu-bridge", "profiles.yaml")}, nil)
	if err != nil {
		return figures{}, err
	}
	auth, err := api.LoadTokenFile(tokens)
	if err != nil {
		return figures{}, err
	}
	log := slog.New(slog.DiscardHandler)
	pipePool, err := store.Open(ctx, store.Config{URL: dbURL, MaxConns: 8})
	if err != nil {
		return figures{}, err
	}
	defer pipePool.Close()
	proc, err := pipeline.New(pipeline.Config{Replica: "bench", LoadInterval: -1},
		pipeline.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/bench"), Policy: holder,
			Placement: noPlacement{}, Catalog: holder.Catalog(), Log: log})
	if err != nil {
		return figures{}, err
	}
	directPath := direct.Wire(proc) // the direct path: results, failures, deadlines
	ep, err := webhook.New(webhook.Config{
		Sources: []webhook.Source{{Name: "flood", Auth: webhook.AuthBearer, Tokens: []string{hookToken}, Rate: 1e6, Burst: 1e6}},
		Store:   requests.NewStore(pool, "bench"), Pool: pool, Logger: log, OnCommitted: proc.Wake,
	})
	if err != nil {
		return figures{}, err
	}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: auth, Logger: log})
	ep.Register(srv)
	ep.RegisterOperator(srv)
	if err := srv.Start(); err != nil {
		return figures{}, err
	}
	defer srv.Shutdown()
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { ep.Run(rctx) })
	wg.Go(func() { proc.Run(rctx) })
	wg.Go(func() { directPath.Run(rctx) })
	defer func() { stop(); wg.Wait() }()
	base := "http://" + srv.Addr()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

	var f figures
	alone, err := sendQuiet(ctx, client, base, instB, quiet, quietRate)
	if err != nil {
		return f, err
	}
	if f.aloneP50, f.aloneP99, err = decisionTimes(ctx, pool, alone); err != nil {
		return f, err
	}

	// The flood, then B while A's backlog waits.
	var failed atomic.Pointer[error]
	var fwg sync.WaitGroup
	jobs := make(chan int)
	for range 32 {
		fwg.Go(func() {
			for i := range jobs {
				path, tok := "/v1/requests", "member-a"
				if i%2 == 1 {
					path, tok = "/v1/webhooks/flood", hookToken
				}
				if _, err := post(ctx, client, base+path, tok, instA[i%len(instA)]); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	for i := range flood {
		jobs <- i
	}
	close(jobs)
	fwg.Wait()
	if err := failed.Load(); err != nil {
		return f, *err
	}
	under, err := sendQuiet(ctx, client, base, instB, quiet, quietRate)
	if err != nil {
		return f, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE processed_at IS NULL AND project_id = $1`, projA).Scan(&f.backlog); err != nil {
		return f, err
	}
	if f.floodP50, f.floodP99, err = decisionTimes(ctx, pool, under); err != nil {
		return f, err
	}
	f.ratio = f.floodP99 / f.aloneP99
	return f, nil
}

// instances inserts n instances of project and returns their uuids.
func instances(ctx context.Context, pool *pgxpool.Pool, project string, n int) ([]string, error) {
	var out []string
	for range n {
		id := uuid.NewString()
		if _, err := pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, $2, 'u', 'h', 'n', 'active', 'running')`, id, project); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

// sendQuiet sends n of B's requests at rate per second (open loop),
// alternating the two routes, waits until each is decided and returns
// their ids.
func sendQuiet(ctx context.Context, client *http.Client, base string, inst []string, n int, rate float64) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
		wg.Go(func() {
			path, tok := "/v1/requests", "member-b"
			if i%2 == 1 {
				path, tok = "/v1/webhooks/flood", hookToken
			}
			id, err := post(ctx, client, base+path, tok, inst[i%len(inst)])
			if err != nil {
				errs <- err
			}
			ids[i] = id
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return ids, nil
}

// decisionTimes waits until every request of ids is decided and returns
// the p50 and p99 of their decision times, in seconds.
func decisionTimes(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID) (float64, float64, error) {
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM decisions WHERE request_id = ANY($1)`, ids).Scan(&n); err != nil {
			return 0, 0, err
		}
		if n >= len(ids) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("%d of %d requests decided: %w", n, len(ids), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	rows, err := pool.Query(ctx, `SELECT extract(epoch FROM d.created_at - r.created_at)::float8
		FROM decisions d JOIN requests r ON r.id = d.request_id WHERE r.id = ANY($1)`, ids)
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	var ds []float64
	for rows.Next() {
		var d float64
		if err := rows.Scan(&d); err != nil {
			return 0, 0, err
		}
		ds = append(ds, d)
	}
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	sort.Float64s(ds)
	q := func(p float64) float64 { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return q(0.50), q(0.99), nil
}

func post(ctx context.Context, client *http.Client, url, token, inst string) (uuid.UUID, error) {
	body := []byte(`{"type":"GPU_LOAD","vm_id":"` + inst + `","workload":"training","metrics":{"util":0.5},"nonce":"` + uuid.NewString() + `"}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return uuid.Nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
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
		return uuid.Nil, errors.New("no request_id in the answer")
	}
	return a.RequestID, nil
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}
