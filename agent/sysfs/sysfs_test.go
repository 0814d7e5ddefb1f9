package sysfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// tree builds a minimal sysfs layout under t.TempDir(), the way the kernel
// lays it out: real directories under devices/, symlinks from class/ and bus/.
type tree struct {
	t    *testing.T
	root string
}

func newTree(t *testing.T) *tree { return &tree{t: t, root: t.TempDir()} }

func (tr *tree) file(rel, content string) {
	tr.t.Helper()
	p := filepath.Join(tr.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) link(rel, target string) {
	tr.t.Helper()
	p := filepath.Join(tr.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) mkdir(rel string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Join(tr.root, rel), 0o755); err != nil {
		tr.t.Fatal(err)
	}
}

const t4Desc = "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4"

// gpu adds an mdev parent with the given types (id → name, available).
func (tr *tree) gpu(addr string, types map[string]int) string {
	dev := "devices/pci0000:00/" + addr
	tr.file(dev+"/vendor", "0x10de\n")
	tr.file(dev+"/device", "0x1eb8\n")
	tr.mkdir("bus/pci/drivers/nvidia")
	tr.link(dev+"/driver", "../../../bus/pci/drivers/nvidia")
	tr.mkdir("kernel/iommu_groups/27/devices")
	tr.link(dev+"/iommu_group", "../../../kernel/iommu_groups/27")
	for id, avail := range types {
		td := dev + "/mdev_supported_types/" + id
		tr.file(td+"/name", "GRID T4-"+id+"\n")
		tr.file(td+"/description", t4Desc+"\n")
		tr.file(td+"/device_api", "vfio-pci\n")
		tr.file(td+"/available_instances", strconv.Itoa(avail)+"\n")
		tr.file(td+"/create", "")
		tr.mkdir(td + "/devices")
	}
	tr.link("class/mdev_bus/"+addr, "../../"+dev)
	tr.link("bus/pci/devices/"+addr, "../../../"+dev)
	return dev
}

// mdev adds an existing mdev of type typ under parent dev.
func (tr *tree) mdev(dev, typ, uuid string) {
	md := dev + "/" + uuid
	tr.file(md+"/remove", "")
	tr.link(md+"/mdev_type", "../mdev_supported_types/"+typ)
	tr.link("bus/mdev/devices/"+uuid, "../../../"+md)
	tr.link(dev+"/mdev_supported_types/"+typ+"/devices/"+uuid, "../../../"+uuid)
}

const (
	u1 = "4b20d080-1b54-4048-85b3-a6a62d165c01"
	u2 = "6d7e9b1c-0f2a-4c4e-9e59-0b1d2a3c4d5e"
)

func TestMdevLayout(t *testing.T) {
	ctx := context.Background()
	tr := newTree(t)
	dev := tr.gpu("0000:3b:00.0", map[string]int{"nvidia-222": 16, "nvidia-232": 3, "nvidia-10": 0})
	tr.gpu("0000:d8:00.0", map[string]int{"nvidia-232": 4})
	tr.mdev(dev, "nvidia-232", u1)
	// A non-PCI parent (s390 css) is skipped.
	tr.mkdir("devices/css0/0.0.fffe")
	tr.link("class/mdev_bus/0.0.fffe", "../../devices/css0/0.0.fffe")

	h := New(tr.root)
	parents, err := h.MdevParents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantParents := []Parent{
		{Addr: pci.MustParse("0000:3b:00.0"), VendorID: "0x10de", DeviceID: "0x1eb8", Driver: "nvidia", IOMMUGroup: 27},
		{Addr: pci.MustParse("0000:d8:00.0"), VendorID: "0x10de", DeviceID: "0x1eb8", Driver: "nvidia", IOMMUGroup: 27},
	}
	if !reflect.DeepEqual(parents, wantParents) {
		t.Errorf("parents = %+v\nwant %+v", parents, wantParents)
	}

	types, err := h.Types(ctx, parents[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ty := range types {
		ids = append(ids, ty.ID)
	}
	if got, want := strings.Join(ids, ","), "nvidia-10,nvidia-222,nvidia-232"; got != want {
		t.Errorf("type order = %s, want %s", got, want)
	}
	got := types[2]
	want := MdevType{
		ID: "nvidia-232", Name: "GRID T4-nvidia-232", Description: t4Desc,
		Desc:      Description{NumHeads: 4, FRLConfig: 60, FramebufferMB: 4096, MaxResolution: "7680x4320", MaxWidth: 7680, MaxHeight: 4320, MaxInstance: 4},
		DeviceAPI: "vfio-pci", AvailableInstances: 3, Devices: []string{u1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("type = %+v\nwant %+v", got, want)
	}

	mdevs, err := h.Mdevs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantM := []Mdev{{UUID: u1, Parent: parents[0].Addr, Type: "nvidia-232"}}
	if !reflect.DeepEqual(mdevs, wantM) {
		t.Errorf("mdevs = %+v, want %+v", mdevs, wantM)
	}
}

func TestEmptyHost(t *testing.T) {
	h := New(t.TempDir())
	ctx := context.Background()
	if p, err := h.MdevParents(ctx); err != nil || len(p) != 0 {
		t.Errorf("parents = %v, %v", p, err)
	}
	if m, err := h.Mdevs(ctx); err != nil || len(m) != 0 {
		t.Errorf("mdevs = %v, %v", m, err)
	}
	if v, err := h.VFs(ctx); err != nil || len(v) != 0 {
		t.Errorf("vfs = %v, %v", v, err)
	}
	if _, err := h.Types(ctx, pci.MustParse("0000:3b:00.0")); !errors.Is(err, hosterr.ErrNotFound) {
		t.Errorf("types of missing parent: %v", err)
	}
}

// recWriter records writes and answers with a programmed error.
type recWriter struct {
	mu     sync.Mutex
	writes []string
	err    error
}

func (w *recWriter) WriteFile(p string, b []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, p+"="+string(b))
	return w.err
}

func TestCreateRemoveMdev(t *testing.T) {
	ctx := context.Background()
	tr := newTree(t)
	dev := tr.gpu("0000:3b:00.0", map[string]int{"nvidia-232": 2, "nvidia-233": 0})
	tr.mdev(dev, "nvidia-232", u1)
	parent := pci.MustParse("00000000:3B:00.0")

	w := &recWriter{}
	h := NewWithWriter(tr.root, w)
	if err := h.CreateMdev(ctx, parent, "nvidia-232", u2); err != nil {
		t.Fatal(err)
	}
	if err := h.RemoveMdev(ctx, u1); err != nil {
		t.Fatal(err)
	}
	want := []string{
		filepath.Join(tr.root, "class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-232/create") + "=" + u2,
		filepath.Join(tr.root, "bus/mdev/devices", u1, "remove") + "=1",
	}
	if !reflect.DeepEqual(w.writes, want) {
		t.Errorf("writes = %q\nwant %q", w.writes, want)
	}

	tests := []struct {
		name   string
		parent string
		typ    string
		uuid   string
		werr   error
		want   hosterr.Code
	}{
		{"unknown parent", "0000:3c:00.0", "nvidia-232", u2, nil, hosterr.NotFound},
		{"unknown type", "0000:3b:00.0", "nvidia-999", u2, nil, hosterr.NotFound},
		{"bad type", "0000:3b:00.0", "../x", u2, nil, hosterr.Invalid},
		{"bad uuid", "0000:3b:00.0", "nvidia-232", "nope", nil, hosterr.Invalid},
		{"exists", "0000:3b:00.0", "nvidia-232", u1, nil, hosterr.Exists},
		{"no capacity", "0000:3b:00.0", "nvidia-233", u2, nil, hosterr.NoCapacity},
		{"kernel EEXIST", "0000:3b:00.0", "nvidia-232", u2, &os.PathError{Op: "write", Err: syscall.EEXIST}, hosterr.Exists},
		{"kernel EUSERS", "0000:3b:00.0", "nvidia-232", u2, &os.PathError{Op: "write", Err: syscall.EUSERS}, hosterr.NoCapacity},
		{"kernel ENOSPC", "0000:3b:00.0", "nvidia-232", u2, &os.PathError{Op: "write", Err: syscall.ENOSPC}, hosterr.NoCapacity},
		{"kernel EACCES", "0000:3b:00.0", "nvidia-232", u2, &os.PathError{Op: "write", Err: syscall.EACCES}, hosterr.PermissionDenied},
		{"kernel EIO", "0000:3b:00.0", "nvidia-232", u2, &os.PathError{Op: "write", Err: syscall.EIO}, hosterr.Internal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewWithWriter(tr.root, &recWriter{err: tc.werr})
			err := h.CreateMdev(ctx, pci.MustParse(tc.parent), tc.typ, tc.uuid)
			if got := hosterr.CodeOf(err); got != tc.want {
				t.Errorf("code = %q (%v), want %q", got, err, tc.want)
			}
		})
	}
	if err := h.RemoveMdev(ctx, u2); !errors.Is(err, hosterr.ErrNotFound) {
		t.Errorf("remove missing = %v", err)
	}
	hb := NewWithWriter(tr.root, &recWriter{err: &os.PathError{Op: "write", Err: syscall.EBUSY}})
	if err := hb.RemoveMdev(ctx, u1); !errors.Is(err, hosterr.ErrInUse) {
		t.Errorf("remove busy = %v", err)
	}
}

func TestKernelWriterNeverCreates(t *testing.T) {
	p := filepath.Join(t.TempDir(), "create")
	if err := (KernelWriter{}).WriteFile(p, []byte("x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("write to missing attribute = %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("KernelWriter created a file")
	}
	os.WriteFile(p, nil, 0o644)
	if err := (KernelWriter{}).WriteFile(p, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "abc" {
		t.Errorf("content = %q", b)
	}
}

func TestCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tr := newTree(t)
	tr.gpu("0000:3b:00.0", map[string]int{"nvidia-232": 2})
	h := NewWithWriter(tr.root, &recWriter{})
	if _, err := h.MdevParents(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("parents: %v", err)
	}
	if err := h.CreateMdev(ctx, pci.MustParse("0000:3b:00.0"), "nvidia-232", u1); !errors.Is(err, context.Canceled) {
		t.Errorf("create: %v", err)
	}
}
