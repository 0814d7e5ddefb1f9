package controls_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testagent"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestGPUFault injects an Xid 79 into the GPU a first vGPU landed on,
// through the agent's NVML mock: the agent reports the fault, the bridge
// drains the GPU with the fault as reason and puts the fault trait on its
// provider (inventory untouched), the next vGPU goes to the other GPU
// although packing prefers the used one; `gpu undrain` clears the mark
// and the trait, and the GPU takes vGPUs again. Every step is audited.
func TestGPUFault(t *testing.T) {
	f := newFleet(t)
	f.start("placement.sync_interval=1s") // the fault trait follows in the sync rounds
	a := f.hosts[0]
	_, mock := testagent.StartMock(f.ctx, t, f.pool, testagent.Host{Name: a.name, Node: a.node,
		GPUs: [2]string{a.gpus[0], a.gpus[1]}, VM: a.vm, Dir: f.dir})
	f.notifyCreates()

	landed := func(id string) string {
		t.Helper()
		r := f.final(id)
		if r.State != "succeeded" {
			t.Fatalf("request %s: %s %s %q", id, r.State, r.Code, r.Reason)
		}
		var gpu string
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT provider_uuid::text FROM vgpu_attachments WHERE request_id = $1`, id).Scan(&gpu), "attachment")
		return gpu
	}
	sick := landed(f.request(a))
	var sickPCI string
	for addr, p := range a.providers {
		if p == sick {
			sickPCI = addr
		}
	}
	if sickPCI == "" {
		t.Fatalf("the vGPU landed on %s, not one of host A's GPUs %v", sick, a.providers)
	}
	traits := func() ([]string, int) {
		t.Helper()
		tr, err := resourceproviders.GetTraits(f.ctx, f.sc, sick).Extract()
		testsvc.Must(t, err, "traits")
		inv, err := resourceproviders.GetInventories(f.ctx, f.sc, sick).Extract()
		testsvc.Must(t, err, "inventories")
		return tr.Traits, inv.Inventories["VGPU"].Total
	}
	if tr, _ := traits(); slices.Contains(tr, nova.GPUFaultTrait) {
		t.Fatalf("the fault trait before any fault: %v", tr)
	}

	if !mock.InjectXid(pci.MustParse(sickPCI), 79) {
		t.Fatal("the agent does not watch the GPU's Xid events")
	}
	const reason = "Xid 79: GPU has fallen off the bus"
	f.waitFor(30*time.Second, "the GPU marked for its fault", func() bool {
		var fault, drainReason string
		var drained bool
		err := f.pool.QueryRow(f.ctx, `SELECT coalesce(fault_reason,''), drained, coalesce(drain_reason,'') FROM gpus WHERE provider_uuid = $1`,
			sick).Scan(&fault, &drained, &drainReason)
		return err == nil && fault == reason && drained && drainReason == "GPU fault: "+reason
	})
	f.waitFor(30*time.Second, "the fault trait on the GPU's provider", func() bool {
		tr, _ := traits()
		return slices.Contains(tr, nova.GPUFaultTrait)
	})
	if tr, total := traits(); !slices.Contains(tr, t4q4Trait) || total != 4 {
		t.Errorf("the fault changed more than the fault trait: traits %v, VGPU total %d (want %s kept, 4)", tr, total, t4q4Trait)
	}
	gl, err := f.admin.GPUs(f.ctx, apiclient.GPUFilter{})
	testsvc.Must(t, err, "gpus")
	if i := slices.IndexFunc(gl.GPUs, func(g apiclient.GPU) bool { return g.ProviderUUID == sick }); i < 0 || !gl.GPUs[i].Drained ||
		gl.GPUs[i].DrainReason != "GPU fault: "+reason {
		t.Errorf("GET /v1/gpus does not show the fault drain: %s", gl.Raw)
	}

	// The bridge's notification tells the fault and the instance whose vGPU runs there.
	var payload string
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT payload::text FROM bridge_notifications WHERE event_type = 'vgpu.gpu.fault'
		AND payload->'versioned_object.data'->>'provider_uuid' = $1`, sick).Scan(&payload), "the vgpu.gpu.fault notification")
	for _, want := range []string{`"reason": "` + reason + `"`, `"instances": ["` + a.vm + `"]`, `"xid": 79`, nova.GPUFaultTrait} {
		if !strings.Contains(payload, want) {
			t.Errorf("vgpu.gpu.fault payload lacks %s: %s", want, payload)
		}
	}

	// The rules hear of the fault, once per instance on the GPU.
	f.waitFor(30*time.Second, "the rules' decision on bridge.GPU_FAULT", func() bool {
		var n int
		err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM decisions d JOIN events e ON e.id = d.event_id
			WHERE e.event_type = 'GPU_FAULT' AND e.instance_uuid = $1 AND d.decision::text LIKE '%GPU of your vGPU failed (Xid 79: GPU has fallen off the bus)%'`,
			a.vm).Scan(&n)
		return err == nil && n == 1
	})

	// Packing would put the next vGPU on the used GPU; faulted, the other gets it.
	if got := landed(f.request(a)); got == sick {
		t.Errorf("a vGPU landed on the faulted GPU %s", sick)
	}

	// The agent still reports the fault: undrain holds (the fault is not new).
	d, err := f.admin.SetDrain(f.ctx, apiclient.DrainGPU, sick, "GPU reset, Xid cleared (ticket 4712)", false)
	testsvc.Must(t, err, "undrain GPU")
	if d.Drained {
		t.Fatalf("undrain: %s", d.Raw)
	}
	f.waitFor(30*time.Second, "the fault trait removed", func() bool {
		tr, _ := traits()
		return !slices.Contains(tr, nova.GPUFaultTrait)
	})
	if tr, total := traits(); !slices.Contains(tr, t4q4Trait) || total != 4 {
		t.Errorf("undrain changed more than the fault trait: traits %v, VGPU total %d", tr, total)
	}
	time.Sleep(3 * time.Second) // a few agent reports, still saying Xid 79
	var fault string
	var drained bool
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT coalesce(fault_reason,''), drained FROM gpus WHERE provider_uuid = $1`, sick).Scan(&fault, &drained), "gpu")
	if fault != "" || drained {
		t.Errorf("after undrain: fault %q drained %t; the agent's same fault marked the GPU again", fault, drained)
	}
	if got := landed(f.request(a)); got != sick {
		t.Errorf("after undrain the vGPU landed on %s, want the used GPU %s (packing)", got, sick)
	}

	for _, want := range []struct{ action, actor string }{
		{"gpu.fault", "vgpu-agent/" + a.name},
		{"placement.fault_trait_add", ""},
		{"gpu.undrain", "ops"},
		{"placement.fault_trait_remove", ""},
	} {
		var n int
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM audit_log WHERE action = $1 AND object_id = $2 AND ($3 = '' OR actor = $3)`,
			want.action, sick, want.actor).Scan(&n), "audit")
		if n != 1 {
			t.Errorf("%d audit rows %s by %q of %s, want 1", n, want.action, want.actor, sick)
		}
	}
	var detail string
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT detail->>'fault_cleared' FROM audit_log WHERE action = 'gpu.undrain' AND object_id = $1`, sick).Scan(&detail), "undrain audit")
	if detail != reason {
		t.Errorf("the undrain's audit says it cleared %q, want %q", detail, reason)
	}
}
