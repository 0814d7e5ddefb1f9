package fakehost

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

// Kernel is a sysfs.Writer that applies a write to the fake tree the way the
// kernel and NVIDIA's driver would, and fails with the errno they use.
type Kernel struct {
	root string
	spec Spec

	mu sync.Mutex
	// InUse, when set, reports whether an mdev is held by a running VM.
	// Removing it then waits until InUse says it is not, as the kernel
	// (6.1) does: the write to the mdev's remove file does not fail, it
	// blocks until QEMU lets the device go (vfio waits for its last user;
	// after a signal, uninterruptibly). Set it before the first write.
	InUse func(uuid string) bool
	// Writes counts the writes applied, for tests.
	Writes int

	waiting atomic.Int32
}

// Waiting is how many writes to a remove file wait for an mdev in use.
func (k *Kernel) Waiting() int { return int(k.waiting.Load()) }

// waitReleased blocks while the mdev a remove file belongs to is in use.
func (k *Kernel) waitReleased(path string) {
	uuid := filepath.Base(filepath.Dir(path))
	if k.InUse == nil || !k.InUse(uuid) {
		return
	}
	k.waiting.Add(1)
	defer k.waiting.Add(-1)
	for k.InUse(uuid) {
		time.Sleep(10 * time.Millisecond)
	}
}

var _ sysfs.Writer = (*Kernel)(nil)

func werr(path string, errno syscall.Errno) error {
	return &os.PathError{Op: "write", Path: path, Err: errno}
}

// WriteFile applies one attribute write.
func (k *Kernel) WriteFile(path string, data []byte) error {
	if filepath.Base(path) == "remove" {
		k.waitReleased(path)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	val := strings.TrimSpace(string(data))
	base := filepath.Base(path)
	dir := filepath.Dir(path)
	var err error
	switch {
	case base == "create" && filepath.Base(filepath.Dir(dir)) == "mdev_supported_types":
		err = k.create(path, filepath.Dir(filepath.Dir(dir)), filepath.Base(dir), val)
	case base == "remove" && k.isMdevDir(dir):
		err = k.remove(path, dir, val)
	case base == "current_vgpu_type" && filepath.Base(dir) == "nvidia":
		err = k.setVFType(path, filepath.Dir(dir), val)
	default:
		f, oerr := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if oerr != nil {
			return oerr
		}
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		k.Writes++
	}
	return err
}

func (k *Kernel) rel(p string) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	rootReal, err := filepath.EvalSymlinks(k.root)
	if err != nil {
		return "", err
	}
	return filepath.Rel(rootReal, real)
}

func (k *Kernel) isMdevDir(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, "mdev_type"))
	return err == nil
}

func (k *Kernel) mdevGPU(a pci.Addr) (MdevGPU, bool) {
	for _, g := range k.spec.MdevGPUs {
		if g.Addr == a {
			return g, true
		}
	}
	return MdevGPU{}, false
}

func validUUID(s string) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	for i, c := range s {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			continue
		}
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

func (k *Kernel) create(path, parentDir, typ, uuid string) error {
	if !validUUID(uuid) {
		return werr(path, syscall.EINVAL)
	}
	uuid = strings.ToLower(uuid)
	prel, err := k.rel(parentDir)
	if err != nil {
		return werr(path, syscall.ENODEV)
	}
	a, err := pci.Parse(filepath.Base(prel))
	if err != nil {
		return werr(path, syscall.ENODEV)
	}
	g, ok := k.mdevGPU(a)
	if !ok {
		return werr(path, syscall.ENODEV)
	}
	if _, err := os.Lstat(filepath.Join(k.root, "bus/mdev/devices", uuid)); err == nil {
		return werr(path, syscall.EEXIST)
	}
	counts, err := mdevCounts(filepath.Join(k.root, prel))
	if err != nil {
		return err
	}
	if available(g, counts, typ) <= 0 {
		return werr(path, syscall.EUSERS) // mdev core: no available instance
	}
	b := &builder{root: k.root}
	b.mdev(prel, typ, uuid)
	if b.err != nil {
		return b.err
	}
	return recomputeMdev(filepath.Join(k.root, prel), g)
}

func (k *Kernel) remove(path, dir, val string) error {
	if val != "1" {
		return werr(path, syscall.EINVAL)
	}
	rel, err := k.rel(dir)
	if err != nil {
		return werr(path, syscall.ENODEV)
	}
	uuid := filepath.Base(rel)
	real := filepath.Join(k.root, rel)
	typ, _ := os.Readlink(filepath.Join(real, "mdev_type"))
	typ = filepath.Base(typ)
	parent := filepath.Dir(real)
	for _, p := range []string{
		filepath.Join(k.root, "bus/mdev/devices", uuid),
		filepath.Join(parent, "mdev_supported_types", typ, "devices", uuid),
	} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := os.RemoveAll(real); err != nil {
		return err
	}
	a, err := pci.Parse(filepath.Base(parent))
	if err != nil {
		return err
	}
	g, _ := k.mdevGPU(a)
	return recomputeMdev(parent, g)
}

// mdevCounts counts a parent's mdevs per type from its devices/ directories.
func mdevCounts(parentDir string) (map[string]int, error) {
	ents, err := os.ReadDir(filepath.Join(parentDir, "mdev_supported_types"))
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, e := range ents {
		ds, err := os.ReadDir(filepath.Join(parentDir, "mdev_supported_types", e.Name(), "devices"))
		if err != nil {
			return nil, err
		}
		counts[e.Name()] = len(ds)
	}
	return counts, nil
}

// available is what available_instances reads for typeID given the mdevs
// per type: without heterogeneous mode a GPU holds one type only; with it,
// types share the framebuffer.
func available(g MdevGPU, counts map[string]int, typeID string) int {
	var t *Type
	for i := range g.Types {
		if g.Types[i].ID == typeID {
			t = &g.Types[i]
		}
	}
	if t == nil {
		return 0
	}
	left := t.MaxInstance - counts[typeID]
	if !g.Heterogeneous {
		for id, n := range counts {
			if id != typeID && n > 0 {
				return 0
			}
		}
		return max(left, 0)
	}
	var used uint64
	for _, o := range g.Types {
		used += uint64(counts[o.ID]) * o.FramebufferMB
	}
	if used >= g.MemoryMB || t.FramebufferMB == 0 {
		return 0
	}
	return max(min(left, int((g.MemoryMB-used)/t.FramebufferMB)), 0)
}

func recomputeMdev(parentDir string, g MdevGPU) error {
	counts, err := mdevCounts(parentDir)
	if err != nil {
		return err
	}
	for _, t := range g.Types {
		p := filepath.Join(parentDir, "mdev_supported_types", t.ID, "available_instances")
		if err := os.WriteFile(p, []byte(strconv.Itoa(available(g, counts, t.ID))+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (k *Kernel) setVFType(path, vfDir, val string) error {
	if _, err := strconv.ParseUint(val, 10, 32); err != nil {
		return werr(path, syscall.EINVAL)
	}
	rel, err := k.rel(vfDir)
	if err != nil {
		return werr(path, syscall.ENODEV)
	}
	a, err := pci.Parse(filepath.Base(rel))
	if err != nil {
		return werr(path, syscall.ENODEV)
	}
	for _, g := range k.spec.VFIOGPUs {
		if !slices.Contains(g.VFs(), a) {
			continue
		}
		nv := filepath.Join(k.root, rel, "nvidia")
		cur, _ := os.ReadFile(filepath.Join(nv, "current_vgpu_type"))
		curS := strings.TrimSpace(string(cur))
		if n, _ := strconv.Atoi(val); n != 0 {
			if curS != "0" && curS != "" {
				return werr(path, syscall.EBUSY)
			}
			b, _ := os.ReadFile(filepath.Join(nv, "creatable_vgpu_types"))
			types, _ := sysfs.ParseCreatableTypes(string(b))
			if !slices.ContainsFunc(types, func(t sysfs.VFType) bool { return t.ID == val }) {
				return werr(path, syscall.EINVAL)
			}
		} else {
			val = "0"
			// A VF without a type has no parameters either.
			if err := os.WriteFile(filepath.Join(nv, "vgpu_params"), nil, 0o644); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(nv, "current_vgpu_type"), []byte(val+"\n"), 0o644); err != nil {
			return err
		}
		return recomputeVFs(k.root, g)
	}
	return werr(path, syscall.ENODEV)
}

// vfCurrent reads the current type id of each VF of g ("" for none).
func vfCurrent(root string, g VFIOGPU) map[pci.Addr]string {
	out := map[pci.Addr]string{}
	for _, vf := range g.VFs() {
		b, _ := os.ReadFile(filepath.Join(root, devPath(vf), "nvidia", "current_vgpu_type"))
		s := strings.TrimSpace(string(b))
		if s != "0" {
			out[vf] = s
		}
	}
	return out
}

// recomputeVFs rewrites every VF's creatable_vgpu_types: a type is
// creatable while its instance count is below its maximum, its framebuffer
// fits in what the typed VFs leave of the GPU's and, unless the GPU is in
// heterogeneous mode (types of different sizes coexist), no other type is
// in use. The list shrinks as VFs are typed, as the driver's does.
func recomputeVFs(root string, g VFIOGPU) error {
	cur := vfCurrent(root, g)
	counts := map[string]int{}
	var used uint64
	for _, id := range cur {
		counts[id]++
		for _, t := range g.Types {
			if t.ID == id {
				used += t.FramebufferMB
			}
		}
	}
	var creatable []sysfs.VFType
	for _, t := range g.Types {
		other := false
		for id, n := range counts {
			if !g.Heterogeneous && id != t.ID && n > 0 {
				other = true
			}
		}
		if other || counts[t.ID] >= t.MaxInstance || used+t.FramebufferMB > g.MemoryMB {
			continue
		}
		creatable = append(creatable, sysfs.VFType{ID: t.ID, Name: t.Name})
	}
	text := sysfs.FormatCreatableTypes(creatable)
	for _, vf := range g.VFs() {
		p := filepath.Join(root, devPath(vf), "nvidia", "creatable_vgpu_types")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// String is for logs.
func (k *Kernel) String() string { return fmt.Sprintf("fakehost.Kernel(%s)", k.root) }

// VGPUParams reads the nvidia/vgpu_params of mdev id (a UUID) or, when id
// is a PCI address, of that vendor-VFIO VF, in the fake host under dir.
func VGPUParams(dir, id string) (string, error) {
	p := filepath.Join(dir, "sys", "bus", "mdev", "devices", id, "nvidia", "vgpu_params")
	if a, err := pci.Parse(id); err == nil {
		p = filepath.Join(dir, "sys", devPath(a), "nvidia", "vgpu_params")
	}
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}
