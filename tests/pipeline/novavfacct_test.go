package pipeline_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/unifiedlimits"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Nova's PCI alias of the Nova-owned VFs of type 1429 (H200X-70C), as
// [placement] nova_vf_aliases = h200x-70c=CUSTOM_VGPU_VF_1429 with
// nova_vf_resource_classes = CUSTOM_VGPU_VF_1429=1429 gives it.
const (
	vfAlias = "h200x-70c"
	vfClass = "CUSTOM_VGPU_VF_1429"
)

var vfAliases = map[string]placement.NovaVFAlias{vfAlias: {Class: vfClass, TypeID: vfType}}

// TestQuotaCountsNovaOwnedVFs: a server whose flavor asks Nova for a VF
// of a Nova-owned VF GPU (pci_passthrough:alias=h200x-70c:1) counts one
// H200X-70C in its project's per-profile usage. With the bridge's own
// unified limit vgpu:H200X-70C = 1 for projects D and E in the real
// Keystone, D, which holds such a server, is refused a direct-path
// H200X-70C with code quota (the reason names the limit and the usage of
// 1); E, which holds none, gets the one free bridge-owned VF of the host.
// GET /v1/quota (Processor.Quota) shows D's usage of 1 and its VGPU
// count.
func TestQuotaCountsNovaOwnedVFs(t *testing.T) {
	t.Parallel()
	lw := newLimitsWorld(t, 10)
	d, e := lw.project("novavf-d", -1), lw.project("novavf-e", -1)
	lw.register(lw.bridge, unifiedlimits.ProfilePrefix+vfProfile, 10)
	lw.limit(d, lw.bridge, unifiedlimits.ProfilePrefix+vfProfile, 1)
	lw.limit(e, lw.bridge, unifiedlimits.ProfilePrefix+vfProfile, 1)
	w := newWorldWith(t, testPolicy, withProjects(map[int]string{4: d, 5: d, 6: e}))
	w.startAgent()
	r := w.startBridge(replicaOpts{name: "r1", owned: []placement.OwnedDecl{{Host: w.host, PCI: vfPF, TypeID: vfType}},
		limits: lw.source(testsvc.KeystoneURL()), novaVFAliases: vfAliases})
	w.reportedFreeVFs(30 * time.Second)
	_, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish the bridge-owned GPUs")
	w.gpus[vfPF] = w.ownedProvider() // removed with the world's providers

	// D's server of an alias flavor, as the bridge keeps it from Nova's
	// notifications (its flavor with its extra specs).
	_, err = w.pool.Exec(w.ctx, `UPDATE instances SET flavor = jsonb_build_object('name', 'vf.h200x-70c',
		'extra_specs', jsonb_build_object('pci_passthrough:alias', $2::text)) WHERE uuid = $1`, w.domains[5].UUID, vfAlias+":1")
	testsvc.Must(t, err, "D's alias flavor")

	v, err := r.proc.Quota(w.ctx, d)
	testsvc.Must(t, err, "D's quota view")
	var usage = -1
	for _, l := range v.Limits {
		if l.Profile == vfProfile {
			usage = l.Usage
		}
	}
	if usage != 1 || v.VGPUs != 1 {
		t.Errorf("D's quota view: %+v; want vgpu:%s usage 1 and 1 vGPU", v, vfProfile)
	}

	attach := func(i int) requests.Request {
		return w.wait(w.submit("GPU_REQUEST", w.domains[i].UUID, map[string]any{"vgpu_profile": vfProfile}), 90*time.Second)
	}
	want := "vgpu:" + vfProfile + ": limit 1, usage 1, request 1"
	if got := attach(4); got.State != requests.Rejected || got.Code != flow.CodeQuota || !strings.Contains(got.Reason, want) {
		t.Errorf("D's direct %s: %s (%s: %s), want rejected with code quota and a reason with %q", vfProfile, got.State, got.Code, got.Reason, want)
	}
	if got := attach(6); got.State != requests.Succeeded {
		t.Errorf("E's direct %s: %s (%s: %s), want succeeded", vfProfile, got.State, got.Code, got.Reason)
	}
}

// TestAccountsNovaOwnedVFs: Nova's instance.create.end of a server whose
// flavor has pci_passthrough:alias=h200x-70c:1 opens a flavor interval of
// one H200X-70C (class CUSTOM_VGPU_VF_1429, type 1429) on its host in
// the bridge's usage, from Nova's time of the launch; its
// instance.delete.end closes it. The events are Nova's own samples, run
// by the pipeline against the real Postgres.
func TestAccountsNovaOwnedVFs(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1", novaVFAliases: vfAliases})
	// The catalog learns type 1429's name from the host's report (its
	// typed VF); a type it does not know yet is accounted by type alone.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := w.holder.Catalog().ByTypeID(vfType); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the catalog never learnt type %s", vfType)
		}
		time.Sleep(100 * time.Millisecond)
	}
	inst := uuid.NewString()
	specs := map[string]string{"pci_passthrough:alias": vfAlias + ":1", "hw:cpu_policy": "dedicated"}
	send := func(sample string, at time.Time) int64 {
		b, err := novatest.ResolveFile(filepath.Join("..", "..", novatest.SamplesDir, sample+".json"))
		testsvc.Must(t, err, "sample "+sample)
		var msg struct {
			EventType string         `json:"event_type"`
			Payload   map[string]any `json:"payload"`
		}
		testsvc.Must(t, json.Unmarshal(b, &msg), "sample "+sample)
		data := msg.Payload["nova_object.data"].(map[string]any)
		data["uuid"] = inst
		data["flavor"].(map[string]any)["nova_object.data"].(map[string]any)["extra_specs"] = specs
		p, err := json.Marshal(msg.Payload)
		testsvc.Must(t, err, "payload")
		var id int64
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, project_id)
			VALUES ('nova', $1, $2, $3, $4, $5, $6) RETURNING id`, testsvc.Name("msg"), msg.EventType, inst, at, p, w.project).Scan(&id), "event")
		return id
	}
	processed := func(id int64) {
		deadline := time.Now().Add(60 * time.Second)
		for {
			var done bool
			testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT processed_at IS NOT NULL FROM events WHERE id = $1`, id).Scan(&done), "event state")
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("event %d not processed", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	type interval struct {
		profile, vgpuType, class, host string
		amount                         int
		ended                          bool
	}
	read := func() []interval {
		rows, err := w.pool.Query(w.ctx, `SELECT coalesce(profile,''), coalesce(vgpu_type,''), resource_class, coalesce(host,''), amount,
			ended_at IS NOT NULL FROM vgpu_usage WHERE instance_uuid = $1 AND path = 'flavor' ORDER BY id`, inst)
		testsvc.Must(t, err, "usage")
		defer rows.Close()
		var out []interval
		for rows.Next() {
			var i interval
			testsvc.Must(t, rows.Scan(&i.profile, &i.vgpuType, &i.class, &i.host, &i.amount, &i.ended), "usage row")
			out = append(out, i)
		}
		return out
	}
	launched := time.Now().Add(-10 * time.Second)
	processed(send("instance-create-end", launched))
	got := read()
	if len(got) != 1 || got[0].profile != vfProfile || got[0].vgpuType != vfType || got[0].class != vfClass || got[0].amount != 1 ||
		got[0].host == "" || got[0].ended {
		t.Fatalf("usage after the launch: %+v; want one open interval of 1 %s (type %s, class %s) on its host", got, vfProfile, vfType, vfClass)
	}
	processed(send("instance-delete-end", time.Now()))
	if got := read(); len(got) != 1 || !got[0].ended {
		t.Errorf("usage after the delete: %+v; want the one interval ended", got)
	}
}
