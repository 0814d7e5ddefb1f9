package index_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
)

func benchRequests(n int, seed uint64) []engine.Request {
	r := rand.New(rand.NewPCG(seed, 1))
	qs := make([]engine.Request, n)
	for i := range qs {
		qs[i] = engine.Request{
			Required:  []string{index.FleetTypes[r.IntN(len(index.FleetTypes))].Trait},
			Forbidden: []string{"COMPUTE_STATUS_DISABLED"},
			Count:     1,
			Strategy:  []engine.Strategy{engine.Pack, engine.Spread}[r.IntN(2)],
			Limit:     5,
		}
	}
	return qs
}

// BenchmarkDecide measures one decision on 1,000 and 10,000 nodes × 8 GPUs
// and reports p50/p99 latency and the index's heap size.
func BenchmarkDecide(b *testing.B) {
	for _, nodes := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			x := index.New(index.Config{})
			x.Load(index.SyntheticFleet(nodes, 8, 1))
			runtime.GC()
			runtime.ReadMemStats(&after)
			e := &engine.Engine{}
			qs := benchRequests(4096, 2)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if _, err := x.Decide(e, qs[i%len(qs)]); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "index-MiB")
			runtime.KeepAlive(x)
		})
	}
}
