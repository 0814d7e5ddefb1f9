// Command webhook is the load harness of the webhook endpoint (make bench).
// Over loopback, with keep-alive and 64 concurrent clients sending signed
// requests (X-Hub-Signature-256 + Idempotency-Key), it measures in one run:
//
//  1. the real endpoint, each 202 after its group commit to Postgres
//     (closed loop: as fast as it goes);
//  2. a bare handler on the same server stack answering 202 at once;
//  3. the bare handler, then the real endpoint, at half the throughput
//     of (1), open loop, latency counted from each request's scheduled
//     start (the bare figures are what the harness itself adds).
//
// Before (1) and (3) it asks Postgres for a CHECKPOINT, so that no phase is
// measured while the kernel writes back what an earlier phase left dirty:
// that write-back, some thirty seconds after (1), would otherwise land in
// (3) and hold up its fsyncs for 100 ms and more.
//
// It prints req/s, p50 and p99 of each and the ratio of (1) to (2), and the
// CPU time per request of (1) and (2) in this process and of (1) in the
// bench database's Postgres backends: on a machine others share, these
// move far less with the load than req/s do. Their quotient is the
// ratio's ceiling where the machine's cores are the bound: the bare
// request's CPU over the durable one's, this process and Postgres
// together. It makes -runs runs (3), each
// on a database of its own on the test Postgres (VGPU_TEST_POSTGRES_URL,
// default postgres://postgres@127.0.0.1:5432/postgres) dropped at its end,
// and prints the medians. -cpuprofile FILE profiles phase (1) of the first
// run. Each run takes about 40 seconds.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/bench/benchkit"
)

var secret = []byte("bench-secret-0123456789abcdef")

func main() {
	clients := flag.Int("clients", 64, "concurrent clients")
	phase := flag.Duration("phase", 10*time.Second, "length of each measured phase")
	workers := flag.Int("workers", 0, "commit workers ([webhooks] commit_workers; 0: its default)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the first run's durable phase (server and load generator) to this file")
	runs := flag.Int("runs", 3, "runs, each on a fresh database; medians are printed")
	flag.Parse()
	var all []figures
	for i := range *runs {
		fmt.Printf("-- run %d of %d\n", i+1, *runs)
		f, err := run(*clients, *phase, *workers, *cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench webhook:", err)
			os.Exit(1)
		}
		all = append(all, f)
		*cpuprofile = ""
	}
	med := func(get func(figures) float64) float64 { return benchkit.Median(all, get) }
	fmt.Printf("\nmedian of %d run(s):\n", len(all))
	fmt.Printf("  durable 202            %7.0f req/s\n", med(func(f figures) float64 { return f.durable.rps }))
	fmt.Printf("  bare 202 (baseline)    %7.0f req/s; ratio durable/bare %.2f (target >= 0.35)\n",
		med(func(f figures) float64 { return f.bare.rps }), med(func(f figures) float64 { return f.durable.rps / f.bare.rps }))
	fmt.Printf("  p99 at half load       %7.2f ms (target <= 15); p50 %.2f ms; bare at that rate p99 %.2f ms\n",
		med(func(f figures) float64 { return ms(f.half.p99) }), med(func(f figures) float64 { return ms(f.half.p50) }),
		med(func(f figures) float64 { return ms(f.bareHalf.p99) }))
	fmt.Printf("  CPU per durable request %6.0f us in this process, %.0f us in Postgres\n",
		med(func(f figures) float64 { return f.cpuProc }), med(func(f figures) float64 { return f.cpuPG }))
	// Where both phases use every core, the ratio cannot exceed the bare
	// request's CPU over the durable one's (this process and Postgres).
	fmt.Printf("  CPU per bare request   %6.0f us; CPU ceiling of the ratio (bare / (durable process + Postgres)) %.2f\n",
		med(func(f figures) float64 { return f.cpuBare }),
		med(func(f figures) float64 { return f.cpuBare / (f.cpuProc + f.cpuPG) }))
}

// figures are one run's results.
type figures struct {
	durable, bare, bareHalf, half stats
	cpuProc, cpuPG                float64 // µs per durable request
	cpuBare                       float64 // µs per bare request
}

func run(clients int, phase time.Duration, workers int, cpuprofile string) (figures, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	admin := benchkit.AdminURL()
	_, pool, dropDB, err := benchkit.MigratedDB(ctx, admin, "", 16)
	if err != nil {
		return figures{}, err
	}
	defer dropDB()

	log := slog.New(slog.DiscardHandler)
	rs := requests.NewStore(pool, "bench")
	ep, err := webhook.New(webhook.Config{
		Sources: []webhook.Source{{Name: "bench", Auth: webhook.AuthHMAC, Secrets: [][]byte{secret},
			Rate: 1e6, Burst: 1e6, MaxBodyBytes: 65536}},
		Store: rs, Pool: pool, Logger: log, BatchSize: 256, CommitWorkers: workers,
	})
	if err != nil {
		return figures{}, err
	}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Logger: log})
	ep.Register(srv)
	srv.Handle(http.MethodPost, "/echo", api.Custom, func(c echo.Context) error {
		io.Copy(io.Discard, c.Request().Body)
		return c.JSONBlob(http.StatusAccepted, []byte(`{"request_id":"00000000-0000-0000-0000-000000000000","status_url":"/x","skipped":[]}`))
	})
	if err := srv.Start(); err != nil {
		return figures{}, err
	}
	defer srv.Shutdown()
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ep.Run(rctx); close(done) }()
	defer func() { rcancel(); <-done }()

	url := "http://" + srv.Addr()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: clients * 2, MaxIdleConnsPerHost: clients * 2, MaxConnsPerHost: clients * 2}}
	var seq atomic.Int64

	cw := "the default number of"
	if workers > 0 {
		cw = strconv.Itoa(workers)
	}
	fmt.Printf("webhook load: %d clients, keep-alive, loopback, %s phases, %s commit workers\n", clients, phase, cw)
	closedLoop(hc, url+"/v1/webhooks/bench", clients, 2*time.Second, &seq) // warm up
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return figures{}, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return figures{}, err
		}
	}
	settle(ctx, pool)
	cpu0, pg0 := benchkit.ProcessCPU(), benchkit.BackendCPU(ctx, pool)
	durable := closedLoop(hc, url+"/v1/webhooks/bench", clients, phase, &seq)
	cpu1, pg1 := benchkit.ProcessCPU(), benchkit.BackendCPU(ctx, pool)
	if cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	cpu2 := benchkit.ProcessCPU()
	bare := closedLoop(hc, url+"/echo", clients, phase*8/10, &seq)
	cpu3 := benchkit.ProcessCPU()
	bareHalf := openLoop(hc, url+"/echo", clients, phase*8/10, durable.rps/2, &seq)
	settle(ctx, pool)
	half := openLoop(hc, url+"/v1/webhooks/bench", clients, phase, durable.rps/2, &seq)

	print := func(label string, r stats) {
		fmt.Printf("%-34s %9.0f req/s   p50 %7.2f ms   p99 %7.2f ms   (%d ok, %d errors)\n",
			label, r.rps, ms(r.p50), ms(r.p99), r.ok, r.errors)
	}
	print("durable 202 (group commit)", durable)
	print("bare handler 202 (baseline)", bare)
	print("bare 202 at that rate (baseline)", bareHalf)
	print(fmt.Sprintf("durable 202 at half load (%.0f/s)", durable.rps/2), half)
	fmt.Printf("ratio durable/bare throughput: %.2f\n", durable.rps/bare.rps)
	f := figures{durable: durable, bare: bare, bareHalf: bareHalf, half: half}
	if durable.ok > 0 {
		f.cpuProc = float64((cpu1 - cpu0).Microseconds()) / float64(durable.ok)
		f.cpuPG = float64((pg1 - pg0).Microseconds()) / float64(durable.ok)
		fmt.Printf("CPU per durable request: %.0f us in this process (server and load generator), %.0f us in its Postgres backends\n",
			f.cpuProc, f.cpuPG)
	}
	if bare.ok > 0 {
		f.cpuBare = float64((cpu3 - cpu2).Microseconds()) / float64(bare.ok)
		fmt.Printf("CPU per bare request: %.0f us in this process (server and load generator)\n", f.cpuBare)
	}
	var n int
	pool.QueryRow(context.Background(), "SELECT count(*) FROM requests").Scan(&n)
	fmt.Printf("requests committed: %d\n", n)
	return f, nil
}

// settle checkpoints the bench database's cluster, so that the phase
// that follows starts with no dirty data of earlier phases to write back.
func settle(ctx context.Context, pool *pgxpool.Pool) {
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintln(os.Stderr, "bench webhook: CHECKPOINT (needs superuser or pg_checkpoint):", err)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type stats struct {
	rps        float64
	p50, p99   time.Duration
	ok, errors int
}

func body(seq int64) []byte {
	return []byte(`{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training","metrics":{"util":0.93,"seq":` +
		strconv.FormatInt(seq, 10) + `}}`)
}

// send posts one signed request and reports whether it got 202.
func send(hc *http.Client, url string, seq int64) bool {
	b := body(seq)
	m := hmac.New(sha256.New, secret)
	m.Write(b)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
	req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatInt(seq, 10))
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusAccepted
}

func summarise(lat []time.Duration, errs int, d time.Duration) stats {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	s := stats{ok: len(lat), errors: errs, rps: float64(len(lat)) / d.Seconds()}
	if len(lat) > 0 {
		s.p50 = lat[len(lat)/2]
		s.p99 = lat[len(lat)*99/100]
	}
	return s
}

// closedLoop runs clients that each send as soon as the last answer came.
func closedLoop(hc *http.Client, url string, clients int, d time.Duration, seq *atomic.Int64) stats {
	var mu sync.Mutex
	var all []time.Duration
	errs := 0
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			e := 0
			for time.Now().Before(end) {
				t0 := time.Now()
				if send(hc, url, seq.Add(1)) {
					lat = append(lat, time.Since(t0))
				} else {
					e++
				}
			}
			mu.Lock()
			all = append(all, lat...)
			errs += e
			mu.Unlock()
		}()
	}
	wg.Wait()
	return summarise(all, errs, time.Since(start))
}

// openLoop sends at a fixed rate, spread over the clients; latency runs
// from each request's scheduled time, so a stall counts against it.
func openLoop(hc *http.Client, url string, clients int, d time.Duration, rate float64, seq *atomic.Int64) stats {
	if rate < 1 {
		rate = 1
	}
	interval := time.Duration(float64(time.Second) / rate)
	due := make(chan time.Time, clients*4)
	start := time.Now()
	go func() {
		defer close(due)
		for next := start; next.Before(start.Add(d)); next = next.Add(interval) {
			time.Sleep(time.Until(next))
			due <- next
		}
	}()
	var mu sync.Mutex
	var all []time.Duration
	errs := 0
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			e := 0
			for t0 := range due {
				if send(hc, url, seq.Add(1)) {
					lat = append(lat, time.Since(t0))
				} else {
					e++
				}
			}
			mu.Lock()
			all = append(all, lat...)
			errs += e
			mu.Unlock()
		}()
	}
	wg.Wait()
	return summarise(all, errs, time.Since(start))
}
