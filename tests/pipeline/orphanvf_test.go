package pipeline_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestDriftOrphanVF: on the bridge-owned VF GPU, a VF the agent typed
// outside any request of the bridge (its journal holds it, no domain
// uses it) is an orphan_mdev finding naming the VF, repaired with
// remove_mdev (vendor_vfio), which clears its type; a VF typed by hand is
// found and left alone (the agent never clears what it did not type);
// Nova's VF, typed and in its domain, is no finding.
func TestDriftOrphanVF(t *testing.T) {
	t.Parallel()
	w, r, _ := vfWorld(t)
	rec, err := drift.New(drift.Config{Replica: "d1", Interval: time.Hour, Repair: true, RepairGrace: 0, StaleReportAge: 5 * time.Minute},
		drift.Deps{Pool: w.pool, Placement: newOutsideTx(t, w.txw, r.svc), Log: logger()})
	testsvc.Must(t, err, "reconciler")
	runOnce(t, rec)
	if fs := w.orphanVFs(); len(fs) != 0 {
		t.Fatalf("orphan findings before any drift: %+v", fs)
	}

	rep, _ := w.report()
	var free []string
	for _, g := range rep.GPUs {
		if g.PCI == vfPF {
			free = g.FreeVFs
		}
	}
	if len(free) < 2 {
		t.Fatalf("free VFs of %s: %v, want 2 or more", vfPF, free)
	}
	agentVF, handVF := free[0], free[1]
	w.rawCommand(protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: uuid.NewString(), ParentPCI: agentVF, TypeID: vfType, VendorVFIO: true})
	testsvc.Must(t, os.WriteFile(filepath.Join(w.fake, "sys", "bus", "pci", "devices", handVF, "nvidia", "current_vgpu_type"), []byte(vfType+"\n"), 0o644),
		"type a VF by hand")
	w.waitFor(30*time.Second, "both VFs reported typed", func() bool {
		rep, ok := w.report()
		n := 0
		for _, g := range rep.GPUs {
			for _, a := range g.Active {
				if (a.PCI == agentVF && a.Owner == protocol.OwnerAgent) || (a.PCI == handVF && a.Owner == protocol.OwnerNova) {
					n++
				}
			}
		}
		return ok && n == 2
	})

	res := runOnce(t, rec)
	fs := w.orphanVFs()
	if len(fs) != 2 || res.Repairs != 1 {
		rep, _ := w.report()
		for _, g := range rep.GPUs {
			if g.PCI == vfPF {
				t.Logf("the report's VF GPU: active %+v, errors %v", g.Active, rep.Errors)
			}
		}
		t.Fatalf("orphan findings %+v (all %+v), run %+v; want two, one repair", fs, w.findings(), res)
	}
	a, h := fs[agentVF], fs[handVF]
	if !a.repairable || a.repairRequest == "" || a.provider != w.gpus[vfPF] {
		t.Errorf("agent-typed VF's finding %+v: want repairable, a repair request, on %s", a, w.gpus[vfPF])
	}
	if h.repairable || h.repairRequest != "" {
		t.Errorf("hand-typed VF's finding %+v: want reported only", h)
	}
	if _, ok := fs[novaVF]; ok {
		t.Errorf("Nova's VF %s (in its domain) is a finding", novaVF)
	}
	repair := w.wait(mustUUID(t, a.repairRequest), 60*time.Second)
	if repair.State != requests.Succeeded {
		t.Fatalf("repair request: %+v", repair)
	}
	var params string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT body->>'params' FROM commands WHERE request_id = $1 AND kind = 'remove_mdev'`, a.repairRequest).Scan(&params),
		"repair command")
	if got := w.vfType(agentVF); got != "0" {
		t.Errorf("current_vgpu_type of %s after the repair = %q, want 0 (params %s)", agentVF, got, params)
	}
	if got := w.vfType(handVF); got != vfType {
		t.Errorf("hand-typed VF %s: %q, want it left typed %s", handVF, got, vfType)
	}
	if got := w.vfType(novaVF); got != vfType {
		t.Errorf("Nova's VF %s: %q, want %s", novaVF, got, vfType)
	}

	// Its report free again, the agent-typed VF's finding is resolved;
	// the hand-typed one stays open.
	w.waitFor(30*time.Second, "the repaired VF reported free", func() bool {
		rep, ok := w.report()
		for _, g := range rep.GPUs {
			if g.PCI == vfPF {
				return ok && slices.Contains(g.FreeVFs, agentVF)
			}
		}
		return false
	})
	runOnce(t, rec)
	fs = w.orphanVFs()
	if _, ok := fs[agentVF]; ok || len(fs) != 1 {
		t.Errorf("open orphan findings after the repair: %+v, want the hand-typed VF's only", fs)
	}
}

type vfFinding struct {
	provider, repairRequest string
	repairable              bool
}

// orphanVFs are the open orphan_mdev findings that name a VF (no mdev),
// by VF.
func (w *world) orphanVFs() map[string]vfFinding {
	w.t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT pci_address, coalesce(provider_uuid::text, ''), coalesce(repair_request_id::text, ''), repairable
		FROM drift_findings WHERE kind = 'orphan_mdev' AND mdev_uuid IS NULL AND resolved_at IS NULL`)
	testsvc.Must(w.t, err, "findings")
	defer rows.Close()
	out := map[string]vfFinding{}
	for rows.Next() {
		var pci string
		var f vfFinding
		testsvc.Must(w.t, rows.Scan(&pci, &f.provider, &f.repairRequest, &f.repairable), "finding")
		out[pci] = f
	}
	return out
}

// TestDriftOrphanVFMixed: on the mixed bridge-owned GPU (HOST/PF=mixed,
// whose provider is no GPU of the mirror), a VF the agent typed outside
// any request of the bridge is an orphan_mdev finding naming the VF,
// repaired with remove_mdev (vendor_vfio), which clears its type; the
// VF of a live 17C of the bridge is no finding, nor is its framebuffer
// claim.
func TestDriftOrphanVFMixed(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testPolicy, withVFHetero())
	r, rp := w.ownVFGPU(replicaOpts{name: "r1"}, placement.MixedType)
	rec, err := drift.New(drift.Config{Replica: "d1", Interval: time.Hour, Repair: true, RepairGrace: 0, StaleReportAge: 5 * time.Minute},
		drift.Deps{Pool: w.pool, Placement: newOutsideTx(t, w.txw, r.svc), Log: logger()})
	testsvc.Must(t, err, "reconciler")
	inst := w.domains[3].UUID
	if res := w.wait(w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "H200X-17C"}), 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("17C: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	held := w.attachedVF(inst, rp, "1431")
	w.reportedVF(held, inst, true, 30*time.Second)

	rep, _ := w.report()
	var free []string
	for _, g := range rep.GPUs {
		if g.PCI == vfPF {
			free = g.FreeVFs
		}
	}
	if len(free) == 0 {
		t.Fatalf("no free VF of %s", vfPF)
	}
	orphan := free[0]
	w.rawCommand(protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: uuid.NewString(), ParentPCI: orphan, TypeID: "1431", VendorVFIO: true})
	w.waitFor(30*time.Second, "the VF reported typed", func() bool {
		rep, ok := w.report()
		for _, g := range rep.GPUs {
			for _, a := range g.Active {
				if a.PCI == orphan && a.Owner == protocol.OwnerAgent {
					return ok
				}
			}
		}
		return false
	})

	res := runOnce(t, rec)
	fs := w.orphanVFs()
	f, ok := fs[orphan]
	if !ok || len(fs) != 1 || res.Repairs != 1 || !f.repairable || f.repairRequest == "" {
		t.Fatalf("orphan findings %+v (all %+v), run %+v; want one, repairable, for %s", fs, w.findings(), res, orphan)
	}
	for _, x := range w.findings() {
		if x.instance == inst || strings.Contains(x.detail, held) || strings.Contains(x.detail, rp) {
			t.Errorf("finding %+v: the 17C, its VF %s and its framebuffer claim on %s are the bridge's", x, held, rp)
		}
	}
	if repair := w.wait(mustUUID(t, f.repairRequest), 60*time.Second); repair.State != requests.Succeeded {
		t.Fatalf("repair request: %+v", repair)
	}
	if got := w.vfType(orphan); got != "0" {
		t.Errorf("current_vgpu_type of %s after the repair = %q, want 0", orphan, got)
	}
	if got := w.vfType(held); got != "1431" {
		t.Errorf("the 17C's VF %s: %q, want it left typed 1431", held, got)
	}
}
