package pipeline

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// BenchmarkLoadEvaluation is the in-memory part of one load evaluation of
// the fleet: for each of 10,000 instances, a 30-minute window of samples
// at the agents' 60 s report period becomes metrics (LoadMetrics) and the
// shipped policy evaluates its bridge.vgpu_load event. It reports
// instance-evaluations per second (one core: run with -cpu 1) and the
// heap the windows hold. What it leaves out: reading the windows from
// Postgres and writing the events, and the pipeline's own decision per
// event (facts, state, record), which the e2e and ingest benches measure.
func BenchmarkLoadEvaluation(b *testing.B) {
	const instances, samples = 10_000, 30
	h, err := policy.NewHolder(policy.Config{RulesFile: "../../etc/vgpu-bridge/rules.yaml", ProfilesFile: "../../etc/vgpu-bridge/profiles.yaml",
		CompatFile: "../../etc/vgpu-bridge/driver-compat.yaml"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	pol := h.Policy()
	now := time.Unix(1_800_000_000, 0)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	windows := make([][]loadSample, instances)
	states := make([]*policy.MemState, instances)
	profiles := []string{"T4-1Q", "T4-2Q", "T4-4Q", "T4-8Q"}
	for i := range windows {
		w := make([]loadSample, samples)
		for j := range w {
			w[j] = loadSample{float64(now.Unix() - int64(60*(samples-1-j))), float64((i*7 + j*13) % 100), float64(512 + i%1024)}
		}
		windows[i] = w
		id := fmt.Sprintf("vm%05d", i)
		states[i] = &policy.MemState{
			Instances: []policy.Instance{{UUID: id, ProjectID: fmt.Sprintf("p%d", i%50), Host: fmt.Sprintf("cmp%03d", i%100), State: "active",
				VGPUs: []policy.VGPU{{Profile: profiles[i%4], Count: 1, GPU: "0000:3b:00.0"}}}},
			HostList: []policy.Host{{Name: fmt.Sprintf("cmp%03d", i%100), Hypervisor: "KVM (QEMU 8.2.2)", DriverVersion: "550.54.16"}},
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc-before.HeapAlloc) / instances
	b.ResetTimer()
	evals, fired := 0, 0
	start := time.Now()
	for b.Loop() {
		for i, w := range windows {
			m, ok := LoadMetrics(w, now, 30*time.Minute)
			if !ok {
				b.Fatal("empty window")
			}
			ev := policy.Event{Kind: KindVGPULoad, Source: BridgeSource, InstanceUUID: states[i].Instances[0].UUID,
				ProjectID: states[i].Instances[0].ProjectID, Metrics: m, Time: now}
			if d := pol.Evaluate(ev, states[i], nil); len(d.Rules) > 0 {
				fired++
			}
			evals++
		}
	}
	b.ReportMetric(float64(evals)/time.Since(start).Seconds(), "evals/s")
	b.ReportMetric(heap, "heap-B/instance") // windows and states, as built here
	if fired == 0 {
		b.Fatal("no rule listened to the load events")
	}
}
