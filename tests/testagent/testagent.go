// Package testagent runs a vgpu-agent in a test's process on a fake host
// (agent/fakehost): two T4s, the first without mdevs, and one running
// domain, as the pipeline-level tests need.
package testagent

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Host is one fake compute host.
type Host struct {
	Name, Node string
	GPUs       [2]string // PCI addresses of the two T4s
	VM         string    // UUID of the running domain instance-00000001
	// Dir holds the fake host (fake-NAME) and the agent's state
	// (state-NAME).
	Dir string
}

// Start builds h's fake host, runs its agent until the test ends (signed
// with testkeys.For(t)), and waits until the bridge on pool has its first
// report. It returns the fake host's directory.
func Start(ctx context.Context, t testing.TB, pool *pgxpool.Pool, h Host) string {
	t.Helper()
	dir, _ := start(ctx, t, pool, h, false)
	return dir
}

// StartMock is Start with the agent on drivers this test opens, and
// returns the fake host's NVML mock too: the test injects GPU faults
// through it (InjectXid, InjectECC, SetLost), which the agent then
// reports as NVML would have them.
func StartMock(ctx context.Context, t testing.TB, pool *pgxpool.Pool, h Host) (string, *gpu.Mock) {
	t.Helper()
	return start(ctx, t, pool, h, true)
}

func start(ctx context.Context, t testing.TB, pool *pgxpool.Pool, h Host, own bool) (string, *gpu.Mock) {
	t.Helper()
	spec := fakehost.DefaultSpec()
	spec.Host = h.Name
	spec.MdevGPUs[0].Addr, spec.MdevGPUs[1].Addr = pci.MustParse(h.GPUs[0]), pci.MustParse(h.GPUs[1])
	spec.MdevGPUs[0].Mdevs = nil
	spec.Domains = []fakehost.Domain{{Name: "instance-00000001", UUID: h.VM, Running: true}}
	fake := filepath.Join(h.Dir, "fake-"+h.Name)
	_, err := fakehost.Build(fake, spec)
	testsvc.Must(t, err, "fake host")
	v, err := agent.LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.host=" + h.Name, "DEFAULT.node=" + h.Node,
		"DEFAULT.transport_url=" + testsvc.TransportURL(t), "DEFAULT.state_path=" + filepath.Join(h.Dir, "state-"+h.Name),
		"DEFAULT.listen=127.0.0.1:0", "DEFAULT.report_check_interval=1s", "DEFAULT.report_interval=5s",
		"DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"},
		testkeys.For(t).Agent(h.Name)...)})
	testsvc.Must(t, err, "agent config")
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	o := agent.RunOptions{FakeHostDir: fake}
	var mock *gpu.Mock
	if own {
		drv, err := agent.OpenFakeHost(fake)
		testsvc.Must(t, err, "fake host drivers")
		t.Cleanup(drv.Close)
		o.Drivers, mock = drv, drv.NVMLMock
	}
	go func() { done <- agent.RunWith(ctx, v, nil, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("agent did not stop")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if pool.QueryRow(ctx, `SELECT count(*) FROM hosts WHERE name = $1 AND node = $2 AND last_report_at IS NOT NULL`,
			h.Name, h.Node).Scan(&n) == nil && n == 1 {
			return fake, mock
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for the agent of %s to report", h.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
