// Command policy is the load harness of the policy engine (make bench): a
// policy of 100 rules (policy.BenchPolicy) against realistic events
// (policy.BenchEvents), one goroutine, full evaluations with explanations.
// It prints evaluations per second of CPU time (per core) and of wall time,
// the median and p99 of per-evaluation latency, the cost per evaluated
// rule, and the ratio against a baseline measured in the same run: the
// same events against a policy with no rules (the fixed cost of an
// evaluation: state lookups, profile preference, quota and decision).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/bench/benchkit"
)

func main() {
	os.Exit(run())
}

func run() int {
	n := flag.Int("n", 20000, "evaluations per round")
	rounds := flag.Int("rounds", 5, "rounds; each figure is the median over rounds (the machine may be shared)")
	rules := flag.Int("rules", 100, "rules in the policy")
	text := flag.Bool("text", false, "also render each explanation as text (Decision.Explain)")
	etc := flag.String("etc", "etc/vgpu-bridge", "directory with profiles.yaml and driver-compat.yaml")
	flag.Parse()
	runtime.GOMAXPROCS(1)

	cat, err := catalog.LoadFile(filepath.Join(*etc, "profiles.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	compat, err := policy.LoadCompatFile(filepath.Join(*etc, "driver-compat.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	load := func(doc string) *policy.Policy {
		p, err := policy.Load(strings.NewReader(doc), policy.Options{Catalog: cat, Compat: compat})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return p
	}
	start := time.Now()
	full := load(policy.BenchPolicy(*rules))
	compile := time.Since(start)
	empty := load("version: 1\n")
	evs, st := policy.BenchEvents(at)

	var bases, ms []result
	for r := 0; r < *rounds; r++ {
		bases = append(bases, measure(empty, evs, st, *n, *text))
		ms = append(ms, measure(full, evs, st, *n, *text))
	}
	base, m := medianOf(bases), medianOf(ms)

	fmt.Printf("policy engine: %d rules (compiled in %s), %d event kinds, %d rounds of %d evaluations (medians of rounds), explanations %s\n",
		*rules, compile.Round(time.Millisecond), len(evs), *rounds, *n, map[bool]string{true: "structured + text", false: "structured"}[*text])
	fmt.Printf("  evaluations/s per core (process CPU time, GC included): %8.0f   (target >= 20000)\n", m.perCPU)
	fmt.Printf("  evaluations/s (wall):              %10.0f\n", m.perWall)
	fmt.Printf("  latency (thread CPU time) median: %6.1f µs   p99: %6.1f µs   (target p99 <= 200 µs)\n", m.median, m.p99)
	fmt.Printf("  latency (wall clock)      median: %6.1f µs   p99: %6.1f µs   (includes waiting for a core)\n", m.wallMedian, m.wallP99)
	fmt.Printf("  rules evaluated per event: %.1f of %d (index by event kind), fired per event: %.1f   cost per evaluated rule: %.2f µs\n",
		m.rulesPerEval, *rules, m.firedPerEval, (m.cpuPerEval-base.cpuPerEval)/m.rulesPerEval)
	fmt.Printf("  baseline (no rules): %10.0f evaluations/s per core, median %.1f µs; ratio full/baseline CPU per evaluation: %.2f\n",
		base.perCPU, base.median, m.cpuPerEval/base.cpuPerEval)
	ok := m.perCPU >= 20000 && m.p99 <= 200
	if !ok {
		fmt.Println("  TARGET MISSED")
	}
	return 0
}

// medianOf takes, figure by figure, the median over rounds.
func medianOf(rs []result) result {
	pick := func(f func(result) float64) float64 { return benchkit.Median(rs, f) }
	return result{
		perCPU:       pick(func(r result) float64 { return r.perCPU }),
		perWall:      pick(func(r result) float64 { return r.perWall }),
		median:       pick(func(r result) float64 { return r.median }),
		p99:          pick(func(r result) float64 { return r.p99 }),
		wallMedian:   pick(func(r result) float64 { return r.wallMedian }),
		wallP99:      pick(func(r result) float64 { return r.wallP99 }),
		cpuPerEval:   pick(func(r result) float64 { return r.cpuPerEval }),
		rulesPerEval: pick(func(r result) float64 { return r.rulesPerEval }),
		firedPerEval: pick(func(r result) float64 { return r.firedPerEval }),
	}
}

type result struct {
	perCPU, perWall, median, p99, wallMedian, wallP99, cpuPerEval, rulesPerEval, firedPerEval float64
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threadCPU is the CPU time of the calling OS thread: unlike the wall
// clock it does not count time the thread waited for a core, so latency
// percentiles stay meaningful on a busy machine.
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

func measure(p *policy.Policy, evs []policy.Event, st policy.State, n int, text bool) result {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The clock's own cost, subtracted from every sample.
	var overhead time.Duration
	for i := 0; i < 1000; i++ {
		a := threadCPU()
		overhead += threadCPU() - a
	}
	overhead /= 1000
	tr := policy.NewTracker()
	// Warm up: caches, the index, the allocator.
	for i := 0; i < 1000; i++ {
		p.Evaluate(evs[i%len(evs)], st, tr)
	}
	runtime.GC()
	samples := make([]float64, n)
	wall := make([]float64, n)
	rulesSeen, fired := 0, 0
	c0, w0 := cpuTime(), time.Now()
	for i := 0; i < n; i++ {
		t, w := threadCPU(), time.Now()
		d := p.Evaluate(evs[i%len(evs)], st, tr)
		if text {
			_ = d.Explain()
		}
		samples[i] = float64((threadCPU() - t - overhead).Nanoseconds()) / 1e3
		wall[i] = float64(time.Since(w).Nanoseconds()) / 1e3
		rulesSeen += len(d.Rules)
		for _, r := range d.Rules {
			if r.Outcome == policy.OutcomeFired {
				fired++
			}
		}
	}
	cpu, elapsed := cpuTime()-c0, time.Since(w0)
	slices.Sort(samples)
	slices.Sort(wall)
	return result{
		perCPU:       float64(n) / cpu.Seconds(),
		perWall:      float64(n) / elapsed.Seconds(),
		median:       samples[n/2],
		p99:          samples[n*99/100],
		wallMedian:   wall[n/2],
		wallP99:      wall[n*99/100],
		cpuPerEval:   float64(cpu.Microseconds()) / float64(n),
		rulesPerEval: float64(rulesSeen) / float64(n),
		firedPerEval: float64(fired) / float64(n),
	}
}
