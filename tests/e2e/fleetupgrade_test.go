// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// brokenVFIOFile, in a fake host's directory, makes fleetUpgradeHook's
// new driver come without its vGPU VFIO module.
const brokenVFIOFile = "upgrade-breaks-vfio"

// fleetUpgradeHook is the agents' driver-upgrade command ([DEFAULT]
// driver_upgrade_command = HOOK FAKE_HOST_DIR): it "installs" the target
// by writing the fake host's driver version (the version asked for, else
// BRANCH.133.10), which NVML reports from the agent's next scan. On a
// host whose directory holds brokenVFIOFile the new driver's
// nvidia_vgpu_vfio module does not load (its sysfs directory goes): the
// agent's diagnostics find the VFIO modules missing, an error.
const fleetUpgradeHook = `#!/bin/sh
set -e
echo "installing ${VGPU_TARGET_VERSION:-branch $VGPU_TARGET_BRANCH}"
if [ -e "$1/` + brokenVFIOFile + `" ]; then rmdir "$1/sys/module/nvidia_vgpu_vfio"; fi
echo "${VGPU_TARGET_VERSION:-$VGPU_TARGET_BRANCH.133.10}" > "$1/` + fakehost.DriverVersionFile + `"
`

// TestFleetUpgradeNova: `vgpuctl fleet upgrade` (POST /v1/fleet/upgrades)
// against the real Nova, two FakeDriver compute hosts with their agents
// (each running the test's upgrade hook) and the bridge in process. Host
// A runs a direct-path VM (the bridge's T4-4Q), host B a Nova-path one
// (its flavor's resources:VGPU). First run, to branch 570: the hosts take
// turns: A is drained, its VM moved to B (host maintenance), its agent
// runs the hook, reports 570.133.10, passes the diagnose gate and A is
// undrained; then B, whose VMs go to A. Both hosts end on 570, undrained,
// the run and each host done, every VM ACTIVE on A with its vGPU (Nova,
// Placement, the bridge, the host), and while a host was being upgraded
// no VM was on it. Second run, to 570.144.02, A first, where the new
// driver comes without nvidia_vgpu_vfio: A's VMs move to B, its gate
// fails, the run stops there (A failed with the diagnostics' reason and
// left drained, B pending, untouched, still on 570.133.10) and the VMs
// run on B with their vGPUs.
func TestFleetUpgradeNova(t *testing.T) {
	n := sharedNova(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	t0 := time.Now()
	hook := filepath.Join(t.TempDir(), "upgrade.sh")
	testsvc.Must(t, os.WriteFile(hook, []byte(fleetUpgradeHook), 0o755), "upgrade hook")
	var hosts, gpus []string
	for _, p := range []string{"flu-a", "flu-b"} {
		h := n.AddHost(t, p)
		gpus = append(gpus, n.AddVGPUChild(t, h, directGPU, directTrait, 4))
		n.StartAgent(t, h, "DEFAULT.driver_upgrade_command="+hook+","+n.FakeHost(h).Dir)
		hosts = append(hosts, h)
	}
	a, b := hosts[0], hosts[1]
	prefix := testsvc.Name("flu")
	vgpuFlavor := n.CreateFlavor(t, prefix+".t4-4q", 2, 2048, 10, map[string]string{"resources:VGPU": "1", "trait:" + directTrait: "required"})
	d, api := startNovaBridge(t, n, "nova.poll_interval=100ms", "pipeline.poll_interval=50ms", "placement.sync_interval=2s",
		"maintenance.poll_interval=200ms", "maintenance.migration_timeout=4m")
	w := &directWorld{t: t, ctx: ctx, n: n, host: a, gpu: gpus[0], api: api, pool: d.Pool,
		flavor: n.CreateFlavor(t, prefix+".small", 2, 2048, 10, nil)}

	directVM := w.bootServer(prefix + "-direct")
	novaVM := n.CreateServer(t, prefix+"-nova", vgpuFlavor, b)
	vms := map[string]bool{directVM: true, novaVM: false} // direct path?
	// Registered after the hosts: the servers go before the hosts retire.
	t.Cleanup(func() {
		for vm := range vms {
			n.DeleteServer(t, vm)
		}
	})
	if r := w.waitFinal(w.gpuRequest(directVM, "T4-4Q")); r.State != "succeeded" {
		t.Fatalf("attach to %s: %s (%s): %s", directVM, r.State, r.Code, r.Reason)
	}
	n.WaitServer(t, novaVM, "ACTIVE")
	waitFor(t, time.Minute, "the bridge to know "+novaVM+"'s vGPU on "+b, func() bool {
		in, err := api.Instance(ctx, novaVM)
		return err == nil && in.Host != nil && *in.Host == b && in.VGPUs == 1
	})
	driver := func(h string) string {
		var v *string
		testsvc.Must(t, d.Pool.QueryRow(ctx, `SELECT driver_version FROM hosts WHERE name = $1`, h).Scan(&v), "driver version")
		return ptrString(v)
	}
	for _, h := range hosts {
		waitFor(t, time.Minute, "the bridge to know "+h+"'s T4 and driver", func() bool {
			x, err := api.Host(ctx, h)
			return err == nil && x.Capacity == 4 && driver(h) != ""
		})
	}
	t.Logf("world ready in %s", time.Since(t0).Round(100*time.Millisecond))

	// First run: both hosts, in turn.
	t1 := time.Now()
	op := runFleetUpgrade(t, ctx, api, n, vms, apiclient.FleetUpgradeBody{Branch: "570", Hosts: hosts})
	t.Logf("first run in %s", time.Since(t1).Round(100*time.Millisecond))
	if op.State != "done" || op.Error != "" || len(op.Hosts) != 2 {
		t.Fatalf("first run %s (%s) with %d hosts, want done", op.State, op.Error, len(op.Hosts))
	}
	for i, h := range op.Hosts {
		if h.Host != hosts[i] || h.State != "done" || h.FromDriver != "550.54.16" || h.ToDriver != "570.133.10" ||
			!strings.Contains(h.Output, "installing branch 570") || h.MaintenanceID == "" || h.UpgradeCommand == "" || h.Error != "" {
			t.Errorf("first run, host %d: %+v; want %s done 550.54.16 → 570.133.10 with the hook's output, its maintenance and command",
				i, h, hosts[i])
		}
		if x, err := api.Host(ctx, h.Host); err != nil || x.Drained {
			t.Errorf("%s after the first run: drained %v (%v), want undrained", h.Host, x.Drained, err)
		}
		if v := driver(h.Host); v != "570.133.10" {
			t.Errorf("%s reports driver %q, want 570.133.10", h.Host, v)
		}
	}
	servedOn(t, w, "after the first run", vms, a, gpus[0], gpus[1]) // B went last: its VMs went to A

	// Second run: A's new driver comes without its VFIO module.
	testsvc.Must(t, os.WriteFile(filepath.Join(n.FakeHost(a).Dir, brokenVFIOFile), nil, 0o644), "break A's upgrade")
	t2 := time.Now()
	op = runFleetUpgrade(t, ctx, api, n, vms, apiclient.FleetUpgradeBody{Branch: "570", Version: "570.144.02", Hosts: hosts})
	t.Logf("second run in %s", time.Since(t2).Round(100*time.Millisecond))
	if op.State != "failed" || !strings.Contains(op.Error, "stopped with 1 host(s) not upgraded") || len(op.Hosts) != 2 {
		t.Fatalf("second run %s (%s), want failed, stopped with B not upgraded", op.State, op.Error)
	}
	if h := op.Hosts[0]; h.State != "failed" || !strings.Contains(h.Error, "gating: diagnose gate") ||
		!strings.Contains(h.Error, "VFIO modules missing") ||
		!strings.Contains(h.Error, "(not loaded: nvidia_vgpu_vfio)") || h.ToDriver != "570.144.02" {
		t.Errorf("second run, %s: %+v; want failed at the gate on the missing VFIO module, after reporting 570.144.02", a, h)
	}
	if h := op.Hosts[1]; h.State != "pending" || h.MaintenanceID != "" || h.UpgradeCommand != "" {
		t.Errorf("second run, %s: %+v; want pending, untouched", b, h)
	}
	if x, err := api.Host(ctx, a); err != nil || !x.Drained || !strings.Contains(x.DrainReason, op.ID) {
		t.Errorf("%s after its failed gate: drained %v (%q, %v), want drained by the run", a, x.Drained, x.DrainReason, err)
	}
	if x, err := api.Host(ctx, b); err != nil || x.Drained || driver(b) != "570.133.10" {
		t.Errorf("%s after the stopped run: drained %v (%v), driver %s; want untouched", b, x.Drained, err, driver(b))
	}
	servedOn(t, w, "after the stopped run", vms, b, gpus[1], gpus[0])
	t.Logf("whole test: %s", time.Since(t0).Round(100*time.Millisecond))
}

// runFleetUpgrade starts a fleet upgrade and waits for its end, failing t
// when a VM of vms is on a host while its driver is being replaced
// (upgrading, verifying, gating), as Nova has it.
func runFleetUpgrade(t *testing.T, ctx context.Context, api *apiclient.Client, n *novaharness.Nova,
	vms map[string]bool, body apiclient.FleetUpgradeBody) apiclient.FleetUpgrade {
	t.Helper()
	_, op, err := api.StartFleetUpgrade(ctx, body)
	testsvc.Must(t, err, "start the fleet upgrade")
	cur, seen := *op, map[string]bool{}
	waitFor(t, 5*time.Minute, "fleet upgrade "+op.ID+" to end", func() bool {
		cur, err = api.FleetUpgrade(ctx, op.ID)
		testsvc.Must(t, err, "get the fleet upgrade")
		for _, h := range cur.Hosts {
			if h.State != "upgrading" && h.State != "verifying" && h.State != "gating" {
				continue
			}
			seen[h.Host] = true
			for vm := range vms {
				if s := n.Server(t, vm); s.Host == h.Host {
					t.Errorf("server %s on %s while the host is %s", vm, h.Host, h.State)
				}
			}
		}
		return cur.State != "running"
	})
	if len(seen) == 0 {
		t.Errorf("fleet upgrade %s: no host seen while its driver was replaced", op.ID)
	}
	b, _ := json.MarshalIndent(cur, "", "  ")
	t.Logf("fleet upgrade:\n%s", b)
	return cur
}
