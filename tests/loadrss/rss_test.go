// Package loadrss measures the bridge's memory while it evaluates the
// load rules of a large fleet (make bench; it needs the test services).
package loadrss

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/placementfleet"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	hosts     = 100    // the e2e bench's fleet: 100 hosts, two T4 each
	instances = 10_000 // each with a direct-path vGPU and a load window
	samples   = 30     // 30 minutes at the agents' 60 s report period
	targetMB  = 150.0
)

// BenchmarkBridgeLoadRSS runs vgpu-bridge (the binary, with the shipped
// policy) on a fleet of 100 hosts × two T4 in the real Placement, which
// it mirrors, and 10,000 instances, each holding a T4 vGPU; then writes
// each instance's load window (30 samples 60 s apart, as the agents'
// reports leave it; written directly: 10,000 running vGPUs behind fake
// agents would measure the agents) and waits until the bridge has turned
// every window into a bridge.vgpu_load event and evaluated the load rules
// on it. It prints the bridge's resident set before the windows (the
// fleet and instances alone, the baseline) and its peak after, against
// the target of 150 MB, and the rate of evaluations through the whole
// pipeline (event, policy, decision, commit).
//
// The load is spread over 0–100 %: the shipped scale-up-busy and
// scale-down-idle rules start tracking their sustained conditions for
// about a third of the instances, and none holds long enough (for: 5m)
// to act within the run. Drift detection is off: the attachments are
// written without their Placement claims.
func BenchmarkBridgeLoadRSS(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	db := testsvc.MigratedPostgres(b)
	pool := testsvc.Pool(b, db)

	pc, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(b), Token: "admin"})
	testsvc.Must(b, err, "placement client")
	trait := placementfleet.UniqueType()
	nodes := make([]placementfleet.Node, hosts)
	prefix := testsvc.Name("rss")
	for i := range nodes {
		nodes[i] = placementfleet.Node{Name: fmt.Sprintf("%s-%03d", prefix, i),
			GPUs: []placementfleet.GPU{{Trait: trait, Total: 16}, {Trait: trait, Total: 16}}}
	}
	t0 := time.Now()
	fleet, err := placementfleet.Load(ctx, pc.ServiceClient(), nodes, 8)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if fleet != nil {
			if err := fleet.Cleanup(ctx); err != nil {
				b.Logf("placement cleanup: %v", err)
			}
		}
	})
	testsvc.Must(b, err, "load the fleet into Placement")
	b.Logf("fleet of %d hosts in Placement in %s", hosts, time.Since(t0).Round(time.Millisecond))

	testsvc.Must(b, seed(ctx, pool, nodes, fleet, trait), "seed hosts, instances and attachments")

	proc := testbridge.NewProc(b, db, "", "drift.enabled=false", "pipeline.load_interval=15s", "pipeline.load_window=30m")
	proc.Start() // ready: the first full Placement sync is done
	time.Sleep(3 * time.Second)
	base := proc.PeakNow()

	t0 = time.Now()
	testsvc.Must(b, windows(ctx, pool), "write the load windows")
	b.Logf("%d windows written in %s", instances, time.Since(t0).Round(time.Millisecond))

	var first, last time.Time
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var n int
		var f, l *time.Time
		testsvc.Must(b, pool.QueryRow(ctx, `SELECT count(*), min(received_at), max(processed_at) FROM events
			WHERE source = 'bridge' AND event_type = 'vgpu_load' AND processed_at IS NOT NULL`).Scan(&n, &f, &l), "count evaluations")
		if n >= instances {
			first, last = *f, *l
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d load events evaluated within 5m (load_interval 15s):\n%s", n, instances, proc.Log(30))
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // a second round of the evaluator
	peak := proc.PeakNow()
	var pending int
	testsvc.Must(b, pool.QueryRow(ctx, `SELECT count(*) FROM policy_load_since`).Scan(&pending), "sustained conditions")

	baseMB, peakMB := mb(base), mb(peak)
	rate := float64(instances) / last.Sub(first).Seconds()
	b.ReportMetric(peakMB, "MB-peak-RSS")
	b.ReportMetric(rate, "evals/s")
	mark := "MET"
	if peakMB > targetMB {
		mark = "MISSED"
	}
	fmt.Printf("bridge RSS, %d hosts × 2 T4 mirrored, %d instances: before the load windows %.0f MB; peak with %d windows of %d samples evaluated %.0f MB (target <= %.0f MB: %s); +%.1f KB per instance\n",
		hosts, instances, baseMB, instances, samples, peakMB, targetMB, mark, (peakMB-baseMB)*1024/instances)
	fmt.Printf("load evaluation through the pipeline: %d events evaluated in %.1f s, %.0f/s; %d sustained conditions tracked\n",
		instances, last.Sub(first).Seconds(), rate, pending)
}

// mb reads "123 MiB".
func mb(s string) float64 {
	v, _ := strconv.ParseFloat(strings.TrimSuffix(s, " MiB"), 64)
	return v * 1.048576
}

// seed writes what the agents' reports and earlier attaches leave: a host
// row with its report per node, and the instances, each with an attached
// T4-1Q on one of its host's GPUs, named in its host's report.
func seed(ctx context.Context, pool *pgxpool.Pool, nodes []placementfleet.Node, fleet *placementfleet.Fleet, trait string) error {
	rng := rand.New(rand.NewPCG(1, 2))
	ids, hostOf, gpuOf, pciOf, projects := make([]string, instances), make([]string, instances), make([]string, instances),
		make([]string, instances), make([]string, instances)
	pcis := []string{"0000:3b:00.0", "0000:d8:00.0"}
	reports := make([]protocol.Report, hosts)
	for h := range reports {
		reports[h] = protocol.Report{V: protocol.Version, Host: nodes[h].Name, Node: nodes[h].Name, AgentVersion: "bench",
			DriverVersion: "550.54.16", Hypervisor: "KVM (QEMU 8.2.2)", SentAt: time.Now()}
		for _, p := range pcis {
			util := float64(rng.IntN(100))
			reports[h].GPUs = append(reports[h].GPUs, protocol.GPU{PCI: p, Name: "Tesla T4", Health: protocol.HealthOK, UtilPercent: &util,
				Types: []protocol.VGPUType{{ID: "nvidia-230", Name: "GRID T4-1Q", FramebufferMiB: 1024, MaxInstances: 16}}})
		}
	}
	for i := range ids {
		h, g := i%hosts, (i/hosts)%2
		ids[i], hostOf[i], gpuOf[i], pciOf[i] = uuid.NewString(), nodes[h].Name, fleet.GPUs[h][g], pcis[g]
		projects[i] = fmt.Sprintf("project-%02d", i%50)
		util := float64(rng.IntN(101))
		fb := uint64(200 + rng.IntN(800))
		reports[h].GPUs[g].Active = append(reports[h].GPUs[g].Active, protocol.VGPU{MdevUUID: uuid.NewString(), TypeID: "nvidia-230",
			InstanceUUID: ids[i], Owner: protocol.OwnerAgent, GuestDriver: "550.54.15", UtilPercent: &util, FBUsedMiB: &fb})
	}
	names, raws := make([]string, hosts), make([]string, hosts)
	for h, r := range reports {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		names[h], raws[h] = r.Host, string(b)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO hosts (name, node, agent_version, driver_version, last_report_at, report)
		SELECT n, n, 'bench', '550.54.16', now(), r::jsonb FROM unnest($1::text[], $2::text[]) AS t(n, r)`, names, raws); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state, flavor, vgpus)
		SELECT i::uuid, p, 'bench-user', h, h, 'active', 'running', '{"name": "m1.large", "extra_specs": {}}'::jsonb, 0
		FROM unnest($1::text[], $2::text[], $3::text[]) AS t(i, h, p)`, ids, hostOf, projects); err != nil {
		return fmt.Errorf("instances: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO vgpu_attachments (id, instance_uuid, host, node, provider_uuid, resource_class, amount,
			pci_address, type_id, profile, trait, mode, state)
		SELECT gen_random_uuid(), i::uuid, h, h, g::uuid, 'VGPU', 1, p, 'nvidia-230', 'T4-1Q', $5, 'live', 'attached'
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS t(i, h, g, p)`, ids, hostOf, gpuOf, pciOf, trait); err != nil {
		return fmt.Errorf("attachments: %w", err)
	}
	return nil
}

// windows writes each instance's load window as the agents' reports
// leave it: samples of SM, framebuffer, encoder and decoder load, 60 s
// apart, ending now.
func windows(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `INSERT INTO instance_load (instance_uuid, host, samples, updated_at)
		SELECT i.uuid, i.host, (SELECT jsonb_agg(jsonb_build_array(round(extract(epoch FROM now())) - 60 * ($1 - 1 - j),
				round((random() * 100)::numeric, 1), 200 + floor(random() * 800), floor(random() * 40), floor(random() * 20)) ORDER BY j)
			FROM generate_series(0, $1 - 1) AS j WHERE i.uuid IS NOT NULL), now()
		FROM instances i`, samples)
	return err
}
