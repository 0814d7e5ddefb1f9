package agent

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// TestFakeFaultsFile: the lines of a fake host's inject-faults file reach
// the NVML mock (an Xid, a lost GPU), a bad line is dropped, and the file
// is removed once every line is applied.
func TestFakeFaultsFile(t *testing.T) {
	const a, b = "0000:3b:00.0", "0000:d8:00.0"
	gpus := []gpu.MockGPU{
		{Name: "Tesla T4", UUID: "GPU-a", Addr: pci.MustParse(a), MemoryMB: 16384, PciDeviceID: 0x1eb810de, HostVGPUMode: "non_sriov"},
		{Name: "Tesla T4", UUID: "GPU-b", Addr: pci.MustParse(b), MemoryMB: 16384, PciDeviceID: 0x1eb810de, HostVGPUMode: "non_sriov"},
	}
	n, m := gpu.NewMockBackend("550.54.16", gpus)
	defer n.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := n.GPUs(ctx); err != nil { // registers the GPUs' events
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, FakeFaultsFile)
	if err := os.WriteFile(path, []byte(a+" xid 79\n"+b+" lost\nnot a fault\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	go watchFakeFaults(ctx, dir, m, slog.New(slog.DiscardHandler))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the injected faults file is still there")
		}
		time.Sleep(50 * time.Millisecond)
	}
	gs, err := n.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{a: "Xid 79: GPU has fallen off the bus", b: "GPU is lost: NVML no longer reaches it (fallen off the bus)"}
	for _, g := range gs {
		if g.Fault == nil || g.Fault.Reason != want[g.Addr.String()] {
			t.Errorf("GPU %s: fault %+v, want %q", g.Addr, g.Fault, want[g.Addr.String()])
		}
	}
}
