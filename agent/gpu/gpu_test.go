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

func TestMockTuning(t *testing.T) {
	ctx := context.Background()
	busy := []MockVGPU{{MdevUUID: mdevA, VMID: vmA, TypeID: 232}}
	b, m := NewMockBackend("550.54.16", []MockGPU{t4("0000:3b:00.0", busy), t4("0000:d8:00.0", nil)})
	idle := pci.MustParse("00000000:D8:00.0")
	if err := b.SetVGPUScheduler(ctx, idle, PolicyFixedShare, 2000); err != nil {
		t.Fatal(err)
	}
	if p, ts, ok := m.Scheduler(idle); !ok || p != PolicyFixedShare || ts != 2000 {
		t.Errorf("scheduler = %s %d %v", p, ts, ok)
	}
	gpus, _ := b.GPUs(ctx)
	if s := gpus[1].Scheduler; s == nil || *s != (Scheduler{PolicyFixedShare, 2000}) {
		t.Errorf("read back scheduler = %+v", s)
	}
	if err := b.SetApplicationClocks(ctx, idle, 5001, 1200); err != nil {
		t.Fatal(err)
	}
	if mem, sm := m.AppClocks(idle); mem != 5001 || sm != 1200 {
		t.Errorf("clocks = %d %d", mem, sm)
	}
	if err := b.ResetApplicationClocks(ctx, idle); err != nil {
		t.Fatal(err)
	}
	if mem, sm := m.AppClocks(idle); mem != 0 || sm != 0 {
		t.Errorf("clocks after reset = %d %d", mem, sm)
	}
	tests := []struct {
		name string
		err  error
		want hosterr.Code
	}{
		{"bad policy", b.SetVGPUScheduler(ctx, idle, "round_robin", 0), hosterr.Invalid},
		{"busy gpu", b.SetVGPUScheduler(ctx, pci.MustParse("0000:3b:00.0"), PolicyEqualShare, 0), hosterr.InUse},
		// What the busy GPU has already is no change: a success.
		{"busy gpu, its own scheduler", b.SetVGPUScheduler(ctx, pci.MustParse("0000:3b:00.0"), PolicyBestEffort, 0), ""},
		{"idle gpu, same again", b.SetVGPUScheduler(ctx, idle, PolicyFixedShare, 2000), ""},

		{"unknown gpu", b.SetApplicationClocks(ctx, pci.MustParse("0000:01:00.0"), 5001, 1200), hosterr.NotFound},
		{"clock out of range", b.SetApplicationClocks(ctx, idle, 99999, 1200), hosterr.Invalid},
		{"zero SM clock", b.SetApplicationClocks(ctx, idle, 5001, 0), hosterr.Invalid},
		{"SM clock only: memory kept", b.SetApplicationClocks(ctx, idle, 0, 900), ""},
	}
	for _, tc := range tests {
		if got := hosterr.CodeOf(tc.err); got != tc.want {
			t.Errorf("%s: %v (%q), want %q", tc.name, tc.err, got, tc.want)
		}
	}
	if mem, sm := m.AppClocks(idle); sm != 900 || mem == 0 {
		t.Errorf("clocks after setting the SM clock alone = mem %d sm %d, want the memory clock kept and sm 900", mem, sm)
	}
	b.Close()
	if _, err := b.GPUs(ctx); !errors.Is(err, hosterr.ErrNVMLUnavailable) {
		t.Errorf("after Close: %v", err)
	}
}

func TestNone(t *testing.T) {
	var b Backend = None{Reason: "disabled by [nvml] backend = none"}
	if g, err := b.GPUs(context.Background()); err != nil || len(g) != 0 {
		t.Errorf("GPUs = %v %v", g, err)
	}
	err := b.SetApplicationClocks(context.Background(), pci.Addr{}, 1, 1)
	if !errors.Is(err, hosterr.ErrNVMLUnavailable) {
		t.Errorf("set clocks = %v", err)
	}
}
