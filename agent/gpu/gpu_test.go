package gpu

import (
	"context"
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

var t4Types = []VGPUType{
	{ID: 222, Name: "GRID T4-1B", Class: "NVS", FramebufferMB: 1024, MaxInstances: 16},
	{ID: 232, Name: "GRID T4-4Q", Class: "Quadro", FramebufferMB: 4096, MaxInstances: 4},
	{ID: 234, Name: "GRID T4-16Q", Class: "Quadro", FramebufferMB: 16384, MaxInstances: 1},
}

const (
	mdevA = "4b20d080-1b54-4048-85b3-a6a62d165c01"
	vmA   = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01"
)

func t4(addr string, active []MockVGPU) MockGPU {
	return MockGPU{
		Name: "Tesla T4", UUID: "GPU-" + addr, Addr: pci.MustParse(addr), MemoryMB: 16384, PciDeviceID: 0x1eb810de,
		HostVGPUMode: "non_sriov", Types: t4Types, UtilGPU: 37, UtilMem: 12, TempC: 51, PowerMW: 32000,
		SMClockMHz: 1590, MemClockMHz: 5001,
		Active:    func() []MockVGPU { return active },
		Creatable: func() []uint32 { return []uint32{232} },
	}
}

func TestInitFailureMakesNoOtherCall(t *testing.T) {
	calls := 0
	// Every other function of this mock is nil: calling one panics, which
	// is what a real NVML does to the process after a failed Init.
	lib := &mock.Interface{InitFunc: func() nvml.Return { calls++; return nvml.ERROR_LIBRARY_NOT_FOUND }}
	n, err := Init(lib, true)
	if n != nil || !errors.Is(err, hosterr.ErrNVMLUnavailable) {
		t.Fatalf("Init = %v, %v", n, err)
	}
	if calls != 1 || len(lib.InitCalls()) != 1 {
		t.Errorf("Init called %d times", calls)
	}
}

// TestOpenReal runs against whatever this machine has: without the NVIDIA
// driver Open fails cleanly (NVMLUnavailable) and nothing crashes; with a
// GPU it lists them.
func TestOpenReal(t *testing.T) {
	n, err := Open()
	if err != nil {
		if !errors.Is(err, hosterr.ErrNVMLUnavailable) {
			t.Fatalf("Open: %v", err)
		}
		t.Logf("no NVML here: %v", err)
		return
	}
	defer n.Close()
	gpus, err := n.GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		t.Logf("GPU %d %s %s %s driver %s mode %s/%s mem %d/%d unavailable %v", g.Index, g.Name, g.UUID, g.Addr, g.DriverVersion,
			g.VirtualizationMode, g.HostVGPUMode, g.Memory.Used, g.Memory.Total, g.Unavailable)
		if g.Addr.IsZero() && g.Addr.String() != "0000:00:00.0" {
			t.Errorf("bad address %v", g.Addr)
		}
	}
}

func TestMockGPUs(t *testing.T) {
	ctx := context.Background()
	active := []MockVGPU{{MdevUUID: mdevA, VMID: vmA, TypeID: 232, FBUsageBytes: 1 << 30, Licensed: false, UtilPct: 64, EncPct: 22, DecPct: 9}}
	b, _ := NewMockBackend("550.54.16", []MockGPU{t4("0000:3b:00.0", active), t4("0000:d8:00.0", nil)})
	defer b.Close()
	gpus, err := b.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 2 {
		t.Fatalf("gpus = %d", len(gpus))
	}
	g := gpus[0]
	if g.Name != "Tesla T4" || g.Addr != pci.MustParse("0000:3b:00.0") || g.DriverVersion != "550.54.16" ||
		g.VirtualizationMode != "host_vgpu" || g.HostVGPUMode != "non_sriov" || g.Heterogeneous == nil || *g.Heterogeneous {
		t.Errorf("gpu = %+v", g)
	}
	if len(g.SupportedTypes) != 3 || g.SupportedTypes[1] != t4Types[1] {
		t.Errorf("supported = %+v", g.SupportedTypes)
	}
	if len(g.CreatableTypes) != 1 || g.CreatableTypes[0].ID != 232 {
		t.Errorf("creatable = %+v", g.CreatableTypes)
	}
	want := VGPUInstance{MdevUUID: mdevA, UUID: mdevA, VMID: vmA, TypeID: 232, TypeName: "GRID T4-4Q", FBUsageBytes: 1 << 30, UtilizationPct: 64,
		EncoderPct: 22, DecoderPct: 9}
	if len(g.Active) != 1 || g.Active[0].Licensed == nil || *g.Active[0].Licensed {
		t.Fatalf("active = %+v", g.Active)
	}
	got := g.Active[0]
	got.Licensed = nil
	if got != want {
		t.Errorf("active = %+v\nwant %+v", got, want)
	}
	if g.License.Unlicensed != 1 || !g.License.Supported {
		t.Errorf("license = %+v", g.License)
	}
	if g.Memory.Total != 16384<<20 || g.Memory.Used != 4096<<20 || g.Memory.Free != 12288<<20 {
		t.Errorf("memory = %+v", g.Memory)
	}
	if g.Utilization != (Util{GPU: 37, Memory: 12, Encoder: 22, Decoder: 9}) || g.TemperatureC != 51 || g.PowerMW != 32000 || g.Clocks.SM != 1590 || g.Clocks.AppMem != 5001 {
		t.Errorf("telemetry = %+v %d %d %+v", g.Utilization, g.TemperatureC, g.PowerMW, g.Clocks)
	}
	if g.Scheduler == nil || g.Scheduler.Policy != PolicyBestEffort {
		t.Errorf("scheduler = %+v", g.Scheduler)
	}
	if len(g.Unavailable) != 0 {
		t.Errorf("unavailable = %v", g.Unavailable)
	}
}

// TestMockTuning changes the scheduler and the clocks of an idle GPU and
// reads them back (NVML's state, the GPU read, and what the call
// returns), and checks what the driver refuses: a scheduler change while
// a VM runs, a timeslice outside the driver's range, clock pairs the GPU
// does not support.
func TestMockTuning(t *testing.T) {
	ctx := context.Background()
	busy := []MockVGPU{{MdevUUID: mdevA, VMID: vmA, TypeID: 232}}
	b, m := NewMockBackend("550.54.16", []MockGPU{t4("0000:3b:00.0", busy), t4("0000:d8:00.0", nil)})
	idle := pci.MustParse("00000000:D8:00.0")
	if p, _, ok := m.Scheduler(idle); ok {
		t.Fatalf("the idle GPU starts with a scheduler set: %s", p)
	}
	a, err := b.SetVGPUScheduler(ctx, idle, PolicyFixedShare, 2000)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Changed || a.Scheduler == nil || *a.Scheduler != (Scheduler{PolicyFixedShare, 2000}) {
		t.Errorf("applied = %+v %+v, want a change to fixed_share 2000 µs", a, a.Scheduler)
	}
	if p, ts, ok := m.Scheduler(idle); !ok || p != PolicyFixedShare || ts != 2000 {
		t.Errorf("NVML's scheduler = %s %d µs %v", p, ts, ok)
	}
	gpus, _ := b.GPUs(ctx)
	if s := gpus[1].Scheduler; s == nil || *s != (Scheduler{PolicyFixedShare, 2000}) {
		t.Errorf("read back scheduler = %+v", s)
	}
	// The driver's default timeslice (0 asks for it) reads back as the
	// driver's value.
	if a, err := b.SetVGPUScheduler(ctx, idle, PolicyEqualShare, 0); err != nil || !a.Changed || a.Scheduler.Policy != PolicyEqualShare || a.Scheduler.TimesliceUs != 2000 {
		t.Errorf("equal_share with the default timeslice: %+v %v", a.Scheduler, err)
	}

	a, err = b.SetApplicationClocks(ctx, idle, 5001, 1200)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Changed || a.AppMemMHz != 5001 || a.AppSMMHz != 1200 {
		t.Errorf("applied clocks = %+v", a)
	}
	if mem, sm := m.AppClocks(idle); mem != 5001 || sm != 1200 {
		t.Errorf("clocks = %d %d", mem, sm)
	}
	gpus, _ = b.GPUs(ctx)
	if c := gpus[1].Clocks; c.AppSM != 1200 || c.AppMem != 5001 {
		t.Errorf("read back clocks = %+v", c)
	}
	if a, err := b.ResetApplicationClocks(ctx, idle); err != nil || a.AppSMMHz != 1590 {
		t.Fatalf("reset: %+v %v, want the default 1590 MHz read back", a, err)
	}
	if mem, sm := m.AppClocks(idle); mem != 0 || sm != 0 {
		t.Errorf("clocks after reset = %d %d", mem, sm)
	}
	busyGPU := pci.MustParse("0000:3b:00.0")
	tests := []struct {
		name    string
		call    func() (Applied, error)
		want    hosterr.Code
		changed bool
	}{
		{"bad policy", func() (Applied, error) { return b.SetVGPUScheduler(ctx, idle, "round_robin", 0) }, hosterr.Invalid, false},
		{"best effort with a timeslice", func() (Applied, error) { return b.SetVGPUScheduler(ctx, idle, PolicyBestEffort, 500) }, hosterr.Invalid, false},
		{"timeslice below the driver's range", func() (Applied, error) { return b.SetVGPUScheduler(ctx, idle, PolicyFixedShare, 500) }, hosterr.Invalid, false},
		{"timeslice above the driver's range", func() (Applied, error) { return b.SetVGPUScheduler(ctx, idle, PolicyFixedShare, 31000) }, hosterr.Invalid, false},
		{"a VM runs on the GPU", func() (Applied, error) { return b.SetVGPUScheduler(ctx, busyGPU, PolicyEqualShare, 0) }, hosterr.InUse, false},
		// What the busy GPU has already is no change: a success.
		{"busy gpu, its own scheduler", func() (Applied, error) { return b.SetVGPUScheduler(ctx, busyGPU, PolicyBestEffort, 0) }, "", false},
		{"idle gpu, new timeslice", func() (Applied, error) { return b.SetVGPUScheduler(ctx, idle, PolicyEqualShare, 4000) }, "", true},
		{"idle gpu, same again", func() (Applied, error) { return b.SetVGPUScheduler(ctx, idle, PolicyEqualShare, 4000) }, "", false},

		{"unknown gpu", func() (Applied, error) { return b.SetApplicationClocks(ctx, pci.MustParse("0000:01:00.0"), 5001, 1200) }, hosterr.NotFound, false},
		{"memory clock not supported", func() (Applied, error) { return b.SetApplicationClocks(ctx, idle, 99999, 1200) }, hosterr.Invalid, false},
		{"SM clock above the GPU's", func() (Applied, error) { return b.SetApplicationClocks(ctx, idle, 5001, 2000) }, hosterr.Invalid, false},
		{"SM clock off the supported steps", func() (Applied, error) { return b.SetApplicationClocks(ctx, idle, 5001, 1201) }, hosterr.Invalid, false},
		{"zero SM clock", func() (Applied, error) { return b.SetApplicationClocks(ctx, idle, 5001, 0) }, hosterr.Invalid, false},
		{"SM clock only: memory kept", func() (Applied, error) { return b.SetApplicationClocks(ctx, idle, 0, 900) }, "", true},
		{"SM clock only, same again", func() (Applied, error) { return b.SetApplicationClocks(ctx, idle, 0, 900) }, "", false},
	}
	for _, tc := range tests {
		a, err := tc.call()
		if got := hosterr.CodeOf(err); got != tc.want || a.Changed != tc.changed {
			t.Errorf("%s: %v (%q), changed %v; want %q, changed %v", tc.name, err, got, a.Changed, tc.want, tc.changed)
		}
	}
	if p, ts, _ := m.Scheduler(idle); p != PolicyEqualShare || ts != 4000 {
		t.Errorf("scheduler after the refusals = %s %d µs, want equal_share 4000 µs kept", p, ts)
	}
	if p, _, ok := m.Scheduler(busyGPU); ok {
		t.Errorf("the busy GPU's scheduler changed to %s", p)
	}
	if mem, sm := m.AppClocks(idle); sm != 900 || mem != 5001 {
		t.Errorf("clocks after setting the SM clock alone = mem %d sm %d, want the memory clock kept and sm 900", mem, sm)
	}
	b.Close()
	if _, err := b.GPUs(ctx); !errors.Is(err, hosterr.ErrNVMLUnavailable) {
		t.Errorf("after Close: %v", err)
	}
	if _, err := b.SetApplicationClocks(ctx, idle, 5001, 1200); !errors.Is(err, hosterr.ErrNVMLUnavailable) {
		t.Errorf("set clocks after Close: %v", err)
	}
}

func TestNone(t *testing.T) {
	var b Backend = None{Reason: "disabled by [nvml] backend = none"}
	if g, err := b.GPUs(context.Background()); err != nil || len(g) != 0 {
		t.Errorf("GPUs = %v %v", g, err)
	}
	_, err := b.SetApplicationClocks(context.Background(), pci.Addr{}, 1, 1)
	if !errors.Is(err, hosterr.ErrNVMLUnavailable) {
		t.Errorf("set clocks = %v", err)
	}
}
