// Command placement is the placement bench harness (make bench): it loads
// a fleet of nodes × GPUs into the real Placement, syncs it into a fresh
// Postgres mirror, and prints, measured in the same run:
//
//   - the bridge's dry-run median vs Placement's
//     GET /allocation_candidates?resources=VGPU:1&required=CUSTOM_…&limit=1
//     median, and their ratio;
//   - full-sync throughput (providers/s);
//   - claims/s against Placement.
//
// Everything it creates (providers, traits, consumers, database) is
// deleted afterwards.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/tests/bench/benchkit"
	"github.com/vgpu-bridge/vgpu-bridge/tests/placementfleet"
)

func main() { os.Exit(run()) }

func run() int {
	var (
		url      = flag.String("placement", envOr("VGPU_TEST_PLACEMENT_URL", "http://127.0.0.1:8778"), "Placement endpoint (noauth2)")
		admin    = flag.String("postgres", envOr("VGPU_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "Postgres admin URL; a scratch database is created")
		nodes    = flag.Int("nodes", 1000, "compute nodes")
		gpus     = flag.Int("gpus", 4, "GPUs per node")
		samples  = flag.Int("placement-samples", 15, "allocation_candidates calls")
		dryruns  = flag.Int("dry-runs", 20000, "bridge dry runs")
		claims   = flag.Int("claims", 200, "claims against Placement")
		workers  = flag.Int("workers", 8, "parallel Placement calls when loading and syncing")
		keepData = flag.Bool("keep", false, "do not delete the fleet afterwards")
	)
	flag.Parse()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	_, pool, dropDB, err := benchkit.MigratedDB(ctx, *admin, "", 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "postgres:", err)
		return 1
	}
	defer dropDB()
	svc, err := placement.New(ctx, placement.Config{
		Client:          placement.ClientConfig{Endpoint: *url, Token: "admin"},
		SyncConcurrency: *workers,
	}, pool, nil, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	// 1. Load the fleet: four types unique to this run.
	run := strings.ToUpper(uuid.NewString()[:6])
	types := make([]string, 4)
	for i := range types {
		types[i] = fmt.Sprintf("CUSTOM_NVIDIA_B%s_%d", run, i)
	}
	r := rand.New(rand.NewPCG(1, 2))
	spec := make([]placementfleet.Node, *nodes)
	for n := range spec {
		spec[n].Name = fmt.Sprintf("bench-%s-%05d", strings.ToLower(run), n)
		for g := 0; g < *gpus; g++ {
			spec[n].GPUs = append(spec[n].GPUs, placementfleet.GPU{Trait: types[r.IntN(len(types))], Total: 16})
		}
	}
	fmt.Printf("placement bench: %d nodes × %d GPUs (%d providers)\n", *nodes, *gpus, *nodes*(*gpus+1))
	t0 := time.Now()
	fleet, err := placementfleet.Load(ctx, svc.Client().ServiceClient(), spec, *workers)
	var consumers []string
	defer func() {
		if *keepData {
			return
		}
		t := time.Now()
		if err := fleet.Cleanup(context.Background(), consumers...); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
		}
		fmt.Printf("cleanup: %.1fs\n", time.Since(t).Seconds())
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		return 1
	}
	fmt.Printf("load into Placement: %.1fs\n", time.Since(t0).Seconds())

	// 2. Full sync into the mirror and the index.
	st, err := svc.SyncNow(ctx, true, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sync:", err)
		return 1
	}
	fmt.Printf("full sync: %d providers in %.2fs = %.0f providers/s (%d GPUs indexed)\n",
		st.Providers, st.Duration.Seconds(), float64(st.Providers)/st.Duration.Seconds(), st.GPUs)
	st2, err := svc.SyncNow(ctx, false, nil)
	if err == nil {
		fmt.Printf("incremental sync, nothing changed: %.2fs (%d fetched)\n", st2.Duration.Seconds(), st2.Fetched)
	}

	// 3. Dry runs: bridge vs Placement, same trait, limit 1.
	ty := types[0]
	req := placement.DryRunRequest{Limit: 1}
	req.Traits.Required = []string{ty}
	lat := make([]time.Duration, 0, *dryruns)
	for i := 0; i < *dryruns; i++ {
		t := time.Now()
		out, err := svc.DryRun(req)
		lat = append(lat, time.Since(t))
		if err != nil || len(out.Candidates) != 1 {
			fmt.Fprintln(os.Stderr, "dry run:", err, out)
			return 1
		}
	}
	bridgeMed := median(lat)
	var pl []time.Duration
	for i := 0; i < *samples; i++ {
		t := time.Now()
		n, _, err := svc.Client().CandidatesCount(ctx, placement.CandidatesOpts{Resources: "VGPU:1", Required: []string{ty}, Limit: 1}, "VGPU")
		pl = append(pl, time.Since(t))
		if err != nil || n != 1 {
			fmt.Fprintln(os.Stderr, "allocation_candidates:", n, err)
			return 1
		}
	}
	plMed := median(pl)
	fmt.Printf("dry-run median: bridge %.2f µs (p99 %.2f µs), Placement allocation_candidates %.1f ms; ratio %.0f×\n",
		us(bridgeMed), us(pct(lat, 99)), float64(plMed.Microseconds())/1e3, float64(plMed)/float64(bridgeMed))

	// 4. Claims/s: sequential, then 8 claimers at once.
	project, user := uuid.NewString(), uuid.NewString()
	claim := func() error {
		c := uuid.NewString()
		consumers = append(consumers, c)
		_, err := svc.Claim(ctx, placement.ClaimRequest{Consumer: c, ProjectID: project, UserID: user,
			Request: engine.Request{Required: []string{types[1]}}})
		return err
	}
	t1 := time.Now()
	for i := 0; i < *claims; i++ {
		if err := claim(); err != nil {
			fmt.Fprintln(os.Stderr, "claim:", err)
			return 1
		}
	}
	seq := time.Since(t1)
	var mu sync.Mutex
	var wg sync.WaitGroup
	cons := make([]string, *claims)
	for i := range cons {
		cons[i] = uuid.NewString()
	}
	consumers = append(consumers, cons...)
	t2 := time.Now()
	var failed int
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(cons); i += 8 {
				_, err := svc.Claim(ctx, placement.ClaimRequest{Consumer: cons[i], ProjectID: project, UserID: user,
					Request: engine.Request{Required: []string{types[2]}, Strategy: engine.Spread}})
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	par := time.Since(t2)
	fmt.Printf("claims: sequential %.1f/s (%.1f ms each), 8 concurrent %.1f/s (%d failed)\n",
		float64(*claims)/seq.Seconds(), float64(seq.Milliseconds())/float64(*claims), float64(*claims)/par.Seconds(), failed)
	return 0
}

func median(d []time.Duration) time.Duration { return pct(d, 50) }

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
