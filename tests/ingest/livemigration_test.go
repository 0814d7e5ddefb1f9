package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestLiveMigrationNovaOrder replays Nova's own live-migration samples,
// unmodified, in the order Nova 26 sends them (nova/compute/manager.py),
// and checks where the bridge records the instance:
//   - a live migration that ends: the destination's
//     live_migration_post_dest.end (host2) moves the instance; the source's
//     live_migration_post.end, sent after it from the source's copy
//     (host = compute, task migrating), does not move it back;
//   - a live migration rolled back: the source's live_migration_rollback.end
//     clears the task; the destination's rollback_dest notifications
//     (sent by a cast, task migrating) do not set it again, also when they
//     arrive after it.
//
// Each order is delivered in one batch, one message at a time, and with
// the two last messages swapped (a broker may deliver the destination's
// notification after the source's).
func TestLiveMigrationNovaOrder(t *testing.T) {
	const uuid = "178b0921-8f85-4257-88b6-2e743b5a975c" // every instance sample's
	byName := map[string]novatest.Sample{}
	for _, s := range samples(t) {
		byName[s.Name] = s
	}
	moved := []string{"instance-create-end",
		"instance-live_migration_pre-start", "instance-live_migration_pre-end",
		"instance-live_migration_post-start", "instance-live_migration_post_dest-start",
		"instance-live_migration_post_dest-end", "instance-live_migration_post-end"}
	rolledBack := []string{"instance-create-end",
		"instance-live_migration_pre-start", "instance-live_migration_pre-end",
		"instance-live_migration_rollback-start", "instance-live_migration_rollback_dest-start",
		"instance-live_migration_rollback-end", "instance-live_migration_rollback_dest-end"}
	swapLast := func(names []string) []string {
		out := append([]string(nil), names...)
		n := len(out)
		out[n-1], out[n-2] = out[n-2], out[n-1]
		return out
	}
	type where struct{ host, node, task string }
	for _, c := range []struct {
		name     string
		sent     []string // in Nova's order: their timestamps increase
		delivery []string // in the broker's order
		oneByOne bool
		want     where
	}{
		{"moved, one batch", moved, moved, false, where{"host2", "host2", ""}},
		{"moved, one by one", moved, moved, true, where{"host2", "host2", ""}},
		{"moved, source's post.end delivered first", moved, swapLast(moved), true, where{"host2", "host2", ""}},
		{"rolled back, one batch", rolledBack, rolledBack, false, where{"compute", "fake-mini", ""}},
		{"rolled back, one by one", rolledBack, rolledBack, true, where{"compute", "fake-mini", ""}},
		{"rolled back, rollback_dest.end delivered first", rolledBack, swapLast(rolledBack), true, where{"compute", "fake-mini", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			cfg := r.config(r.amqpURL)
			r.declare(cfg)
			base := time.Now().Add(-time.Minute).UTC()
			at := map[string]time.Time{}
			for i, name := range c.sent {
				if _, ok := byName[name]; !ok {
					t.Fatalf("no sample %s", name)
				}
				at[name] = base.Add(time.Duration(i) * time.Second)
			}
			wire := func(i int, name string) []byte {
				return byName[name].Wire(fmt.Sprintf("%s-%d", name, i), at[name])
			}
			if c.oneByOne {
				r.start(cfg)
				for i, name := range c.delivery {
					r.publish(infoKey, wire(i, name))
					r.waitCount(i+1, 30*time.Second, `SELECT count(*) FROM events WHERE instance_uuid = $1`, uuid)
				}
			} else {
				var bodies [][]byte
				for i, name := range c.delivery {
					bodies = append(bodies, wire(i, name))
				}
				r.publish(infoKey, bodies...)
				r.start(cfg)
				r.waitCount(len(bodies), 30*time.Second, `SELECT count(*) FROM events WHERE instance_uuid = $1`, uuid)
			}
			var got where
			testsvc.Must(t, r.pool.QueryRow(context.Background(),
				`SELECT coalesce(host, ''), coalesce(node, ''), coalesce(task_state, '') FROM instances WHERE uuid = $1`, uuid).
				Scan(&got.host, &got.node, &got.task), "instance")
			if got != c.want {
				t.Errorf("instance on host %q node %q task %q; want host %q node %q task %q",
					got.host, got.node, got.task, c.want.host, c.want.node, c.want.task)
			}
		})
	}
}
