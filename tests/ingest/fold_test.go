package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// randomEvents makes n instance notifications over a few instances with
// colliding timestamps, all phases, resize target flavors, faults and
// deletions, in random order.
func randomEvents(t *testing.T, seed uint64, n int) [][]byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	t0 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	types := []string{"instance.update", "instance.resize_prep.start", "instance.resize_prep.end", "instance.resize_finish.end",
		"instance.power_off.start", "instance.power_off.end", "instance.reboot.error", "instance.delete.end", "instance.resize_confirm.end"}
	var out [][]byte
	for i := 0; i < n; i++ {
		inst := rng.IntN(4)
		uuid := fmt.Sprintf("00000000-0000-4000-8000-%012d", inst)
		et := types[rng.IntN(len(types))]
		ts := t0.Add(time.Duration(rng.IntN(40)) * time.Second)
		data := map[string]any{"uuid": uuid, "tenant_id": "p1", "user_id": "u1", "host": fmt.Sprintf("h%d", rng.IntN(3)),
			"node": "n", "state": []string{"active", "stopped", "resized", "error"}[rng.IntN(4)], "task_state": nil,
			"power_state": "running", "display_name": fmt.Sprintf("vm-%d", i),
			"flavor": flavorObj(fmt.Sprintf("f%d", rng.IntN(3)), rng.IntN(2) == 0)}
		name := "InstanceActionPayload"
		if et == "instance.update" {
			name, data["state_update"] = "InstanceUpdatePayload", nil
		}
		if et == "instance.resize_prep.start" || et == "instance.resize_prep.end" {
			name, data["new_flavor"] = "InstanceActionResizePrepPayload", flavorObj(fmt.Sprintf("new%d", rng.IntN(3)), true)
		}
		if et == "instance.reboot.error" {
			data["fault"] = map[string]any{"nova_object.name": "ExceptionPayload", "nova_object.namespace": "nova", "nova_object.version": "1.1",
				"nova_object.data": map[string]any{"exception": fmt.Sprintf("E%d", i), "exception_message": "boom", "function_name": "f", "module_name": "m"}}
		}
		if et == "instance.delete.end" {
			// Nova sets deleted_at once per instance.
			data["deleted_at"] = t0.Add(time.Duration(inst) * time.Hour).Format(time.RFC3339)
		}
		version := "1.9"
		if name == "InstanceUpdatePayload" {
			version = "2.1"
		}
		sample, _ := json.Marshal(map[string]any{"event_type": et, "priority": "INFO", "publisher_id": "nova-compute:h",
			"payload": map[string]any{"nova_object.name": name, "nova_object.namespace": "nova", "nova_object.version": version, "nova_object.data": data}})
		w, err := nova.WireMessage(sample, fmt.Sprintf("r%d-%d", seed, i), ts)
		testsvc.Must(t, err, "wire")
		out = append(out, w)
	}
	return out
}

func flavorObj(name string, vgpu bool) map[string]any {
	specs := map[string]string{}
	if vgpu {
		specs["resources:VGPU"] = "1"
	}
	return map[string]any{"nova_object.name": "FlavorPayload", "nova_object.namespace": "nova", "nova_object.version": "1.4",
		"nova_object.data": map[string]any{"flavorid": name, "name": name, "vcpus": 1, "memory_mb": 512, "extra_specs": specs}}
}

// TestFoldEqualsOneByOne: a batch folded per instance gives the same state
// as the same events applied one message per batch, for random orders.
func TestFoldEqualsOneByOne(t *testing.T) {
	for _, seed := range []uint64{7, 11, 23} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { foldEqualsOneByOne(t, seed) })
	}
}

func foldEqualsOneByOne(t *testing.T, seed uint64) {
	events := randomEvents(t, seed, 300)
	state := func(batch int) string {
		r := newRig(t)
		cfg := r.config(r.amqpURL)
		cfg.BatchSize, cfg.Committers, cfg.Prefetch = batch, 1, max(batch, 10)
		r.declare(cfg)
		r.publish(infoKey, events...)
		r.start(cfg)
		r.waitCount(len(events), 60*time.Second, `SELECT count(*) FROM events`)
		var s string
		testsvc.Must(t, r.pool.QueryRow(context.Background(), `SELECT json_agg(x ORDER BY x.uuid)::text FROM (
			SELECT uuid, host, vm_state, flavor->>'name' AS flavor, vgpus, new_flavor->>'name' AS new_flavor,
				fault->>'exception' AS fault, deleted_at, last_event_type, last_event_at, last_event_rank, display_name
			FROM instances) x`).Scan(&s), "state")
		return s
	}
	one, folded := state(1), state(300)
	if one != folded {
		t.Errorf("one by one:\n%s\nfolded:\n%s", one, folded)
	}
}
