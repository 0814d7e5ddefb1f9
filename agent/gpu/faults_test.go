package gpu

import (
	"context"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// TestFaults injects each kind of fault into one GPU of two through the
// mock (events and counters, as NVML delivers them) and checks that the
// backend reports that GPU faulted with its reason, the other healthy,
// and that an event fault outlives the next read (events are read once).
func TestFaults(t *testing.T) {
	const a, b = "0000:3b:00.0", "0000:5e:00.0"
	ampere := func(addr string) MockGPU { g := t4(addr, nil); g.RowRemapper = true; return g }
	tests := []struct {
		name        string
		gpus        func() []MockGPU
		inject      func(*Mock)
		wantSource  string
		wantReason  string
		wantXid     uint64
		wantHealthy bool
	}{
		{name: "none", gpus: func() []MockGPU { return []MockGPU{t4(a, nil), t4(b, nil)} }, inject: func(*Mock) {}, wantHealthy: true},
		{name: "xid 79", gpus: func() []MockGPU { return []MockGPU{t4(a, nil), t4(b, nil)} },
			inject:     func(m *Mock) { m.InjectXid(pci.MustParse(a), 79) },
			wantSource: FaultXid, wantXid: 79, wantReason: "Xid 79: GPU has fallen off the bus"},
		{name: "xid 95", gpus: func() []MockGPU { return []MockGPU{t4(a, nil), t4(b, nil)} },
			inject:     func(m *Mock) { m.InjectXid(pci.MustParse(a), 95) },
			wantSource: FaultXid, wantXid: 95, wantReason: "Xid 95: uncontained ECC error"},
		{name: "xid 43 is the guest's", gpus: func() []MockGPU { return []MockGPU{t4(a, nil), t4(b, nil)} },
			inject: func(m *Mock) { m.InjectXid(pci.MustParse(a), 43) }, wantHealthy: true},
		{name: "uncorrectable ecc", gpus: func() []MockGPU { return []MockGPU{t4(a, nil), t4(b, nil)} },
			inject:     func(m *Mock) { m.InjectECC(pci.MustParse(a), 2) },
			wantSource: FaultECC, wantReason: "double bit ECC error"},
		{name: "retired pages pending", gpus: func() []MockGPU { return []MockGPU{t4(a, nil), t4(b, nil)} },
			inject:     func(m *Mock) { m.SetRetiredPagesPending(pci.MustParse(a), true) },
			wantSource: FaultRetiredPages, wantReason: "retired pages pending: the GPU needs a reset"},
		{name: "row remap pending", gpus: func() []MockGPU { return []MockGPU{ampere(a), ampere(b)} },
			inject:     func(m *Mock) { m.SetRemapPending(pci.MustParse(a), true, false) },
			wantSource: FaultRowRemap, wantReason: "row remap pending: the GPU needs a reset"},
		{name: "gpu lost", gpus: func() []MockGPU { return []MockGPU{t4(a, nil), t4(b, nil)} },
			inject:     func(m *Mock) { m.SetLost(pci.MustParse(a), true) },
			wantSource: FaultLost, wantReason: "GPU is lost: NVML no longer reaches it (fallen off the bus)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			n, m := NewMockBackend("550.54.16", tt.gpus())
			defer n.Close()
			before, err := n.GPUs(ctx) // registers the GPUs' events
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range before {
				if g.Fault != nil {
					t.Fatalf("%s faulted before any injection: %+v", g.Addr, g.Fault)
				}
			}
			tt.inject(m)
			for round := range 2 { // the second read: the event was consumed by the first
				gs, err := n.GPUs(ctx)
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if len(gs) != 2 {
					t.Fatalf("round %d: %d GPUs, want 2", round, len(gs))
				}
				if gs[1].Fault != nil {
					t.Errorf("round %d: %s faulted: %+v", round, b, gs[1].Fault)
				}
				f := gs[0].Fault
				if gs[0].Addr.String() != a {
					t.Errorf("round %d: first GPU %s, want %s", round, gs[0].Addr, a)
				}
				switch {
				case tt.wantHealthy && f != nil:
					t.Errorf("round %d: %s faulted: %+v", round, a, f)
				case tt.wantHealthy:
				case f == nil:
					t.Errorf("round %d: %s not faulted, want %s", round, a, tt.wantReason)
				case f.Source != tt.wantSource || f.Reason != tt.wantReason || f.Xid != tt.wantXid:
					t.Errorf("round %d: fault %+v, want %s/%d %q", round, *f, tt.wantSource, tt.wantXid, tt.wantReason)
				}
			}
		})
	}
}

// TestFaultEventsNeedRegistration: an Xid on a GPU the backend never read
// (so never registered) is not delivered, as with the real driver, and
// one on a registered GPU is.
func TestFaultEventsNeedRegistration(t *testing.T) {
	n, m := NewMockBackend("550.54.16", []MockGPU{t4("0000:3b:00.0", nil)})
	defer n.Close()
	if m.InjectXid(pci.MustParse("0000:3b:00.0"), 79) {
		t.Fatal("an Xid was delivered before the backend registered for events")
	}
	if _, err := n.GPUs(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !m.InjectXid(pci.MustParse("0000:3b:00.0"), 79) {
		t.Fatal("the backend did not register the GPU for Xid events")
	}
}

// TestResetClearsCounterFaults: counters clear on a GPU reset and the
// fault with them; an event fault stays (the agent restarts after a reset).
func TestResetClearsCounterFaults(t *testing.T) {
	a := pci.MustParse("0000:3b:00.0")
	n, m := NewMockBackend("550.54.16", []MockGPU{t4(a.String(), nil)})
	defer n.Close()
	ctx := context.Background()
	if _, err := n.GPUs(ctx); err != nil {
		t.Fatal(err)
	}
	m.SetRetiredPagesPending(a, true)
	gs, _ := n.GPUs(ctx)
	if gs[0].Fault == nil {
		t.Fatal("no fault with retired pages pending")
	}
	m.ResetGPU(a)
	gs, _ = n.GPUs(ctx)
	if gs[0].Fault != nil {
		t.Fatalf("fault after the reset: %+v", gs[0].Fault)
	}
}
