package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestListedServersOrderedWithNotifications: a server listed from Nova's
// API is one more snapshot of its instance, ordered by the time Nova last
// changed it: it makes an unknown instance known (with its flavor's vGPU
// demand), it does not undo a newer notification, a newer listing updates
// what a notification said, and a listed deleted server is deleted for
// good.
func TestListedServersOrderedWithNotifications(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	cfg.ClockSkewTolerance = time.Minute
	r.declare(cfg)
	r.start(cfg)
	ctx := context.Background()
	const id = "7e0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e5f"
	t0 := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	server := func(host, vmState, task string, updated time.Time) computeapi.Detail {
		return computeapi.Detail{Server: computeapi.Server{ID: id, Name: "vm-1", Status: "ACTIVE", VMState: vmState, TaskState: task,
			Host: host, Node: host + "-node", Flavor: computeapi.Flavor{Name: "g1.t4-4q", VCPUs: 4, RAM: 8192, Disk: 20,
				ExtraSpecs: map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"}}},
			ProjectID: "p1", UserID: "u1", AvailabilityZone: "nova", PowerState: 1, Created: t0, Updated: updated}
	}
	apply := func(d computeapi.Detail) int {
		t.Helper()
		var n int
		testsvc.Must(t, pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			var err error
			n, err = ingest.ApplyServers(ctx, tx, []computeapi.Detail{d}, time.Now(), time.Minute)
			return err
		}), "apply servers")
		return n
	}
	type row struct {
		host, vmState, task, power, last string
		vgpus                            int
		deleted                          bool
	}
	state := func() row {
		t.Helper()
		var x row
		testsvc.Must(t, r.pool.QueryRow(ctx, `SELECT coalesce(host, ''), coalesce(vm_state, ''), coalesce(task_state, ''),
			coalesce(power_state, ''), coalesce(last_event_type, ''), vgpus, deleted_at IS NOT NULL FROM instances WHERE uuid = $1`, id).
			Scan(&x.host, &x.vmState, &x.task, &x.power, &x.last, &x.vgpus, &x.deleted), "instance")
		return x
	}

	// Unknown: the listing makes it known.
	if n := apply(server("hostA", "active", "", t0.Add(time.Second))); n != 1 {
		t.Fatalf("listing an unknown server changed %d rows, want 1", n)
	}
	if got, want := state(), (row{"hostA", "active", "", "running", ingest.ServerListEvent, 1, false}); got != want {
		t.Errorf("after the first listing: %+v, want %+v", got, want)
	}

	// A notification newer than the listing wins; an older listing (the
	// same server read before the notification's change) does not undo it.
	r.publish(infoKey, instanceMsg(t, "n1", "instance.power_off.end", id, "stopped", "hostB", nil, t0.Add(10*time.Second)))
	r.waitCount(1, 30*time.Second, `SELECT count(*) FROM events WHERE instance_uuid = $1`, id)
	if n := apply(server("hostA", "active", "", t0.Add(5*time.Second))); n != 0 {
		t.Errorf("an older listing changed %d rows, want 0", n)
	}
	if got := state(); got.host != "hostB" || got.vmState != "stopped" || got.last != "instance.power_off.end" {
		t.Errorf("after an older listing: %+v, want the notification's stopped on hostB", got)
	}
	// Of the same time, the notification wins too.
	if n := apply(server("hostA", "active", "", t0.Add(10*time.Second))); n != 0 {
		t.Errorf("a listing of the notification's time changed %d rows, want 0", n)
	}

	// A newer listing (a notification the bridge never received) updates it.
	if n := apply(server("hostC", "active", "", t0.Add(20*time.Second))); n != 1 {
		t.Errorf("a newer listing changed %d rows, want 1", n)
	}
	if got := state(); got.host != "hostC" || got.vmState != "active" || got.last != ingest.ServerListEvent {
		t.Errorf("after a newer listing: %+v, want active on hostC from the listing", got)
	}

	// Deleted in a changes-since listing: deleted, and no later event
	// brings it back.
	gone := server("hostC", "deleted", "", t0.Add(30*time.Second))
	gone.Status = "DELETED"
	apply(gone)
	r.publish(infoKey, instanceMsg(t, "n2", "instance.power_on.end", id, "active", "hostC", nil, t0.Add(40*time.Second)))
	r.waitCount(2, 30*time.Second, `SELECT count(*) FROM events WHERE instance_uuid = $1`, id)
	if got := state(); got.vmState != "deleted" || !got.deleted {
		t.Errorf("after a listed delete and a later event: %+v, want deleted", got)
	}
}
