// SPDX-License-Identifier: Apache-2.0

package novaharness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
)

// This file holds what the harness needs for Nova's moves beyond cold
// and live migration: evacuation (a compute service forced down, its
// restart), rebuild, shelve and reboot, and the parts of Nova's libvirt
// driver they exercise.

// errUnavailable is the libvirt driver's ComputeResourcesUnavailable
// (the hook answers 409, launcher.py raises it in the driver).
var errUnavailable = errors.New("mdev-capable resource is not available")

// firstVGPU is the VGPU a spawn gets from Nova 26's libvirt driver:
// LibvirtDriver._allocate_mdevs (nova/virt/libvirt/driver.py) looks up
// only the first VGPU allocation it is handed, and raises
// ComputeResourcesUnavailable ("mdev-capable resource is not available")
// when that provider is not in the host's provider tree — as on an
// evacuation, whose spawn gets the instance's whole allocation, the
// source host's providers first (SchedulerReportClient.claim_resources,
// _move_operation_alloc_request).
func (n *Nova) firstVGPU(c hookCall) (map[string]int, error) {
	n.mu.Lock()
	child, ok := n.children[c.VGPUFirst.Provider]
	n.mu.Unlock()
	if !ok || child.host != c.Host {
		return nil, fmt.Errorf("spawn of %s on %s: VGPU allocation on provider %s, not in the host's tree: %w", c.InstanceUUID, c.Host,
			c.VGPUFirst.Provider, errUnavailable)
	}
	return map[string]int{c.VGPUFirst.Provider: c.VGPUFirst.Count}, nil
}

// unassignedMdevs are the host's mdevs of the type on the GPU that no
// domain uses: LibvirtDriver._get_existing_mdevs_not_assigned, which
// _allocate_mdevs takes (from the end of the list) before it creates
// one. Caller holds h.mu.
func (h *FakeHost) unassignedMdevs(ctx context.Context, parent, typeID string) ([]string, error) {
	ms, err := h.Drivers.Sysfs.Mdevs(ctx)
	if err != nil {
		return nil, fmt.Errorf("mdevs of %s: %w", h.Name, err)
	}
	doms, err := h.Drivers.Libvirt.Domains(ctx)
	if err != nil {
		return nil, fmt.Errorf("domains of %s: %w", h.Name, err)
	}
	used := map[string]bool{}
	for _, d := range doms {
		for _, m := range d.Mdevs() {
			used[m] = true
		}
	}
	var free []string
	for _, m := range ms {
		if m.Parent.String() == parent && m.Type == typeID && !used[m.UUID] {
			free = append(free, m.UUID)
		}
	}
	return free, nil
}

// reboot plays LibvirtDriver.reboot: a hard reboot (_hard_reboot)
// destroys the guest and starts it again from a definition whose mdevs
// are those assigned to it (_get_all_assigned_mediated_devices), a soft
// one (_soft_reboot) shuts it down and creates it again: either way the
// domain keeps its persistent mdevs, and a live-only attachment is lost.
// Caller holds h.mu.
func (h *FakeHost) reboot(ctx context.Context, instance string) error {
	conn := h.Drivers.Libvirt
	if err := conn.Shutdown(ctx, instance, 10*time.Second); err != nil && !hosterr.Is(err, hosterr.NotFound) {
		return fmt.Errorf("reboot %s: %w", instance, err)
	}
	if err := conn.Start(ctx, instance); err != nil {
		return fmt.Errorf("reboot %s: %w", instance, err)
	}
	return nil
}

// listDomains answers launcher.py's list: the instance uuids with a
// domain on the host (the libvirt driver's list_instance_uuids).
func (n *Nova) listDomains(ctx context.Context, w http.ResponseWriter, host string) {
	fh := n.FakeHost(host)
	ids := []string{}
	if fh != nil {
		fh.mu.Lock()
		doms, err := fh.Drivers.Libvirt.Domains(ctx)
		fh.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		for _, d := range doms {
			ids = append(ids, d.UUID)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ids)
}

// ServerAction posts one server action (POST /servers/{id}/action) and
// returns once Nova accepted it.
func (n *Nova) ServerAction(t testing.TB, id string, action map[string]any) {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	if err := n.do(ctx, http.MethodPost, "/servers/"+url.PathEscape(id)+"/action", action, nil); err != nil {
		t.Fatalf("server %s action %v: %v", id, action, err)
	}
}

// ForceDown sets (or clears) forced_down on the host's nova-compute
// service (PUT /os-services/{service_id}, microversion ≥ 2.53), as
// `openstack compute service set --down` does before an evacuation.
func (n *Nova) ForceDown(t testing.TB, host string, down bool) {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	if err := n.setComputeService(ctx, host, map[string]any{"forced_down": down}); err != nil {
		t.Fatalf("forced_down=%v on %s: %v", down, host, err)
	}
}

// DisableCompute disables (or enables again) the host's nova-compute
// service (PUT /os-services/{service_id}, status), as `openstack compute
// service set --disable` does: the scheduler's ComputeFilter skips the
// host at once. Unlike ForceDown, the service stays up.
func (n *Nova) DisableCompute(t testing.TB, host string, disabled bool) {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	body := map[string]any{"status": "enabled"}
	if disabled {
		body = map[string]any{"status": "disabled", "disabled_reason": "disabled by the test"}
	}
	if err := n.setComputeService(ctx, host, body); err != nil {
		t.Fatalf("status of %s's nova-compute %v: %v", host, body["status"], err)
	}
}

// setComputeService updates the host's nova-compute service record
// (PUT /os-services/{service_id} with body: status, forced_down).
func (n *Nova) setComputeService(ctx context.Context, host string, body map[string]any) error {
	var out struct {
		Services []struct{ ID, Host string }
	}
	if err := n.do(ctx, http.MethodGet, "/os-services?binary=nova-compute&host="+url.QueryEscape(host), nil, &out); err != nil {
		return fmt.Errorf("nova-compute service of %s: %w", host, err)
	}
	if len(out.Services) != 1 {
		return fmt.Errorf("nova-compute services of %s: %+v, want one", host, out.Services)
	}
	return n.do(ctx, http.MethodPut, "/os-services/"+url.PathEscape(out.Services[0].ID), body, nil)
}

// RestartCompute stops the host's nova-compute and starts it again,
// waiting until it is up: its init_host then runs, which for an
// evacuated instance destroys the guest left on the host and drops the
// instance's allocations there (ComputeManager._destroy_evacuated_instances).
// The service must not be forced down (it would never be up).
func (n *Nova) RestartCompute(t testing.TB, host string) {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	n.restartCompute(t, host)
	// The service's last report is fresh until it misses service_down_time:
	// wait for the new process to have logged its start.
	if err := n.waitReady(ctx, []string{host}); err != nil {
		t.Fatalf("RestartCompute %s: %v\n%s", host, err, n.LogTail(30))
	}
}

// RestartComputeForcedDown stops the nova-compute of a host whose service
// is forced down and starts it again, as Nova's guide has it after an
// evacuation: the repaired host's compute starts, its init_host destroys
// the evacuated guests there and moves their migrations to completed
// (ComputeManager._destroy_evacuated_instances), and only then may the
// service be forced up (the API refuses while done evacuations remain).
// It does not wait for the service, which is never up while forced down:
// the caller waits for what init_host does.
func (n *Nova) RestartComputeForcedDown(t testing.TB, host string) {
	t.Helper()
	n.restartCompute(t, host)
}

// restartCompute stops the host's nova-compute and starts it again.
func (n *Nova) restartCompute(t testing.TB, host string) {
	t.Helper()
	if !n.stopCompute(host) {
		t.Fatalf("RestartCompute: no nova-compute of %s", host)
	}
	if err := n.startCompute(host); err != nil {
		t.Fatal(err)
	}
}

// stopCompute stops the host's nova-compute (SIGTERM, SIGKILL after 20 s)
// and reports whether one ran.
func (n *Nova) stopCompute(host string) bool {
	name := "compute-" + host
	n.mu.Lock()
	i := slices.IndexFunc(n.procs, func(p *proc) bool { return p.name == name })
	var p *proc
	if i >= 0 {
		p = n.procs[i]
		n.procs = slices.Delete(n.procs, i, i+1)
	}
	n.mu.Unlock()
	if p == nil {
		return false
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return true
}

// retireHost ends a host whose test ended: its nova-compute service is
// disabled first (the scheduler's ComputeFilter skips it at once, where a
// stopped but enabled service would count as up until service_down_time),
// then its process stops. A server still on it then stays deleting (Nova's
// API casts the delete to the stopped compute): delete servers in a
// cleanup registered after AddHost. A Nova shared by a package's tests otherwise
// ran every test's computes, with their periodic tasks, to the end of the
// package. Its provider tree stays until Close removes it.
func (n *Nova) retireHost(host string) {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = n.setComputeService(ctx, host, map[string]any{"status": "disabled", "disabled_reason": "its test ended"})
	n.stopCompute(host)
}

// Migration is one record of GET /os-migrations.
type Migration struct {
	ID            int    `json:"id"`
	UUID          string `json:"uuid"`
	Type          string `json:"migration_type"`
	Status        string `json:"status"`
	SourceCompute string `json:"source_compute"`
	DestCompute   string `json:"dest_compute"`
}

// Migrations are the instance's migration records, newest first.
func (n *Nova) Migrations(t testing.TB, instance string) []Migration {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	var out struct {
		Migrations []Migration `json:"migrations"`
	}
	if err := n.do(ctx, http.MethodGet, "/os-migrations?instance_uuid="+url.QueryEscape(instance), nil, &out); err != nil {
		t.Fatalf("migrations of %s: %v", instance, err)
	}
	slices.SortFunc(out.Migrations, func(a, b Migration) int { return b.ID - a.ID })
	return out.Migrations
}

// mdevMigrationRefused fails the live migration of a guest holding a
// mediated device, as the libvirt of Nova 26's era does (its QEMU
// migration driver refuses a domain with <hostdev type='mdev'>; Nova 26
// creates no mdev on the target either — live migration with vGPUs came
// in Nova 2024.1): LibvirtDriver._live_migration_operation gets the
// libvirt error and Nova rolls back (_rollback_live_migration), the guest
// running on with its mdevs on the source.
func (n *Nova) mdevMigrationRefused(ctx context.Context, c hookCall) error {
	if c.Event != "live_migration" {
		return nil
	}
	fh := n.FakeHost(c.Host)
	if fh == nil {
		return nil
	}
	fh.mu.Lock()
	d, err := fh.Drivers.Libvirt.Domain(ctx, c.InstanceUUID)
	fh.mu.Unlock()
	if err != nil || len(d.Mdevs()) == 0 {
		return nil
	}
	return fmt.Errorf("Requested operation is not valid: cannot migrate a domain with <hostdev mode='subsystem' type='mdev'> (%s, mdevs %v)",
		c.InstanceUUID, d.Mdevs())
}

// revert plays LibvirtDriver.finish_revert_migration on the source: the
// guest is defined again with the mdevs assigned to it there
// (_get_all_assigned_mediated_devices — the source's domain, kept through
// the migration), not from the allocations, and started. Without a
// domain on the host the guest gets no mdev. Caller holds h.mu.
func (h *FakeHost) revert(ctx context.Context, c hookCall) error {
	conn := h.Drivers.Libvirt
	d, err := conn.DomainConfig(ctx, c.InstanceUUID)
	if hosterr.Is(err, hosterr.NotFound) {
		return conn.DefineAndStart(ctx, domainXML(c.InstanceName, c.InstanceUUID, nil))
	}
	if err != nil {
		return fmt.Errorf("revert %s: %w", c.InstanceUUID, err)
	}
	// libvirt will not start a guest whose mdev is gone (the guest's
	// creation fails and Nova's revert with it).
	ms, err := h.Drivers.Sysfs.Mdevs(ctx)
	if err != nil {
		return fmt.Errorf("revert %s: %w", c.InstanceUUID, err)
	}
	have := map[string]bool{}
	for _, m := range ms {
		have[m.UUID] = true
	}
	for _, m := range d.Mdevs() {
		if !have[m] {
			return fmt.Errorf("revert %s: device not found: mediated device '%s' not found", c.InstanceUUID, m)
		}
	}
	if d.State == "running" {
		return nil
	}
	return conn.Start(ctx, c.InstanceUUID)
}
