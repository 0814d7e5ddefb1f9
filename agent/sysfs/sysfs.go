// Package sysfs reads and writes the kernel's view of vGPU devices under a
// sysfs root ("/sys" on a host, a tree in t.TempDir() in tests):
//
//   - the mediated-device framework: /sys/class/mdev_bus/<pci>/mdev_supported_types/<type>/
//     {name,description,device_api,available_instances,create,devices/} and
//     /sys/bus/mdev/devices/<uuid>/{mdev_type,remove};
//   - NVIDIA's vendor-specific VFIO (vGPU 17+, SR-IOV VFs):
//     /sys/bus/pci/devices/<VF>/nvidia/{creatable_vgpu_types,current_vgpu_type}.
//
// Writes go through a Writer, so a fake host can apply the kernel's side
// effects to a tree of plain files. Errors are classified with agent/hosterr.
package sysfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// Writer writes one sysfs attribute. The real one opens the existing file
// write-only (sysfs attributes are never created); a fake host emulates the
// kernel.
type Writer interface {
	WriteFile(path string, data []byte) error
}

// KernelWriter writes to real sysfs attribute files.
type KernelWriter struct{}

// WriteFile opens path O_WRONLY|O_TRUNC, as the shell's ">" does, without
// O_CREAT (a missing attribute is an error, never a new file), and writes
// data in one call.
func (KernelWriter) WriteFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr != nil {
		return werr
	}
	return cerr
}

var _ Writer = KernelWriter{}

// Host is a sysfs root.
type Host struct {
	root string
	w    Writer
}

// New returns a Host reading and writing the real kernel files under root
// (normally "/sys").
func New(root string) *Host { return &Host{root: root, w: KernelWriter{}} }

// NewWithWriter returns a Host whose writes go through w (a fake host).
func NewWithWriter(root string, w Writer) *Host { return &Host{root: root, w: w} }

// Root is the sysfs root.
func (h *Host) Root() string { return h.root }

// Parent is a physical device that can host mediated devices.
type Parent struct {
	Addr       pci.Addr `json:"address"`
	VendorID   string   `json:"vendor_id,omitempty"` // "0x10de"
	DeviceID   string   `json:"device_id,omitempty"` // "0x1eb8"
	Driver     string   `json:"driver,omitempty"`    // "nvidia"
	IOMMUGroup int      `json:"iommu_group"`         // -1 when none
}

// MdevType is one entry of mdev_supported_types.
type MdevType struct {
	ID                 string      `json:"id"`   // "nvidia-232"
	Name               string      `json:"name"` // "GRID T4-4Q"
	Description        string      `json:"description,omitempty"`
	Desc               Description `json:"parsed_description"`
	DeviceAPI          string      `json:"device_api"` // "vfio-pci"
	AvailableInstances int         `json:"available_instances"`
	Devices            []string    `json:"devices"` // mdev UUIDs of this type on this parent
}

// Mdev is an existing mediated device.
type Mdev struct {
	UUID   string   `json:"uuid"`
	Parent pci.Addr `json:"parent"`
	Type   string   `json:"type"`
}

func (h *Host) path(elem ...string) string {
	return filepath.Join(append([]string{h.root}, elem...)...)
}

func readString(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func readInt(p string) (int, error) {
	s, err := readString(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return n, nil
}

// linkBase returns the base name of a symlink's target, or "".
func linkBase(p string) string {
	t, err := os.Readlink(p)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

// MdevParents lists PCI devices registered with the mdev framework, sorted by address.
// Non-PCI parents (s390 css/ap) are skipped. A host without the framework has none.
func (h *Host) MdevParents(ctx context.Context) ([]Parent, error) {
	ents, err := os.ReadDir(h.path("class", "mdev_bus"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, classify("list mdev parents", err)
	}
	var out []Parent
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		a, err := pci.Parse(e.Name())
		if err != nil {
			continue
		}
		out = append(out, h.parent(a, h.path("class", "mdev_bus", e.Name())))
	}
	slices.SortFunc(out, func(a, b Parent) int { return compareAddr(a.Addr, b.Addr) })
	return out, nil
}

func (h *Host) parent(a pci.Addr, dir string) Parent {
	p := Parent{Addr: a, IOMMUGroup: -1}
	p.VendorID, _ = readString(filepath.Join(dir, "vendor"))
	p.DeviceID, _ = readString(filepath.Join(dir, "device"))
	p.Driver = linkBase(filepath.Join(dir, "driver"))
	if g := linkBase(filepath.Join(dir, "iommu_group")); g != "" {
		if n, err := strconv.Atoi(g); err == nil {
			p.IOMMUGroup = n
		}
	}
	return p
}

func compareAddr(a, b pci.Addr) int { return strings.Compare(a.String(), b.String()) }

// Types lists the mdev types a parent supports, sorted by id.
func (h *Host) Types(ctx context.Context, parent pci.Addr) ([]MdevType, error) {
	dir := h.path("class", "mdev_bus", parent.String(), "mdev_supported_types")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, classify("list mdev types of "+parent.String(), err)
	}
	out := make([]MdevType, 0, len(ents))
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := readType(filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			return nil, classify("read mdev type "+parent.String()+"/"+e.Name(), err)
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b MdevType) int { return compareTypeID(a.ID, b.ID) })
	return out, nil
}

// compareTypeID orders "nvidia-9" before "nvidia-10".
func compareTypeID(a, b string) int {
	pa, na := splitTypeID(a)
	pb, nb := splitTypeID(b)
	if c := strings.Compare(pa, pb); c != 0 {
		return c
	}
	if na != nb {
		if na < nb {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

func splitTypeID(s string) (string, int) {
	i := strings.LastIndexByte(s, '-')
	if i < 0 {
		return s, -1
	}
	n, err := strconv.Atoi(s[i+1:])
	if err != nil {
		return s, -1
	}
	return s[:i], n
}

func readType(dir, id string) (MdevType, error) {
	t := MdevType{ID: id}
	var err error
	if t.Name, err = readString(filepath.Join(dir, "name")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return t, err
	}
	if t.Description, err = readString(filepath.Join(dir, "description")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return t, err
	}
	t.Desc, _ = ParseDescription(t.Description) // best effort: raw text stays in Description
	if t.DeviceAPI, err = readString(filepath.Join(dir, "device_api")); err != nil {
		return t, err
	}
	if t.AvailableInstances, err = readInt(filepath.Join(dir, "available_instances")); err != nil {
		return t, err
	}
	ents, err := os.ReadDir(filepath.Join(dir, "devices"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return t, err
	}
	t.Devices = []string{}
	for _, e := range ents {
		t.Devices = append(t.Devices, e.Name())
	}
	slices.Sort(t.Devices)
	return t, nil
}

// Mdevs lists existing mediated devices (from /sys/bus/mdev/devices), sorted by UUID.
func (h *Host) Mdevs(ctx context.Context) ([]Mdev, error) {
	dir := h.path("bus", "mdev", "devices")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, classify("list mdevs", err)
	}
	out := make([]Mdev, 0, len(ents))
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m, err := h.mdev(e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Mdev) int { return strings.Compare(a.UUID, b.UUID) })
	return out, nil
}

// Mdev returns one mediated device.
func (h *Host) Mdev(ctx context.Context, uuid string) (Mdev, error) {
	if err := validUUID(uuid); err != nil {
		return Mdev{}, err
	}
	return h.mdev(uuid)
}

func (h *Host) mdev(uuid string) (Mdev, error) {
	link := h.path("bus", "mdev", "devices", uuid)
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return Mdev{}, classify("read mdev "+uuid, err)
	}
	m := Mdev{UUID: uuid, Type: linkBase(filepath.Join(real, "mdev_type"))}
	if m.Parent, err = pci.Parse(filepath.Base(filepath.Dir(real))); err != nil {
		return Mdev{}, hosterr.New(hosterr.Internal, "read mdev "+uuid, fmt.Errorf("parent of %s: %w", real, err))
	}
	return m, nil
}

// CreateMdev writes uuid to <parent>/mdev_supported_types/<typeID>/create.
// It is refused (typed) when the parent or type is unknown (NotFound), the
// UUID exists (Exists) or no instance is available (NoCapacity).
func (h *Host) CreateMdev(ctx context.Context, parent pci.Addr, typeID, uuid string) error {
	op := fmt.Sprintf("create mdev %s on %s/%s", uuid, parent, typeID)
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validUUID(uuid); err != nil {
		return hosterr.New(hosterr.Invalid, op, err)
	}
	if strings.ContainsAny(typeID, "/\x00") || typeID == "" || typeID == "." || typeID == ".." {
		return hosterr.Errorf(hosterr.Invalid, op, "bad type id %q", typeID)
	}
	pdir := h.path("class", "mdev_bus", parent.String())
	if _, err := os.Stat(pdir); err != nil {
		return classify(op, fmt.Errorf("parent %s is not an mdev parent: %w", parent, err))
	}
	tdir := filepath.Join(pdir, "mdev_supported_types", typeID)
	if _, err := os.Stat(tdir); err != nil {
		return classify(op, fmt.Errorf("type %s not supported by %s: %w", typeID, parent, err))
	}
	if _, err := os.Lstat(h.path("bus", "mdev", "devices", uuid)); err == nil {
		return hosterr.Errorf(hosterr.Exists, op, "mdev %s already exists", uuid)
	}
	if n, err := readInt(filepath.Join(tdir, "available_instances")); err == nil && n <= 0 {
		return hosterr.Errorf(hosterr.NoCapacity, op, "available_instances is 0")
	}
	if err := h.w.WriteFile(filepath.Join(tdir, "create"), []byte(uuid)); err != nil {
		return classify(op, err)
	}
	return nil
}

// RemoveMdev writes 1 to /sys/bus/mdev/devices/<uuid>/remove.
func (h *Host) RemoveMdev(ctx context.Context, uuid string) error {
	op := "remove mdev " + uuid
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validUUID(uuid); err != nil {
		return hosterr.New(hosterr.Invalid, op, err)
	}
	p := h.path("bus", "mdev", "devices", uuid, "remove")
	if _, err := os.Stat(p); err != nil {
		return classify(op, err)
	}
	if err := h.w.WriteFile(p, []byte("1")); err != nil {
		return classify(op, err)
	}
	return nil
}

// validUUID accepts the canonical 8-4-4-4-12 hex form the kernel requires.
func validUUID(s string) error {
	if len(s) != 36 {
		return fmt.Errorf("bad uuid %q", s)
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return fmt.Errorf("bad uuid %q", s)
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return fmt.Errorf("bad uuid %q", s)
			}
		}
	}
	return nil
}

// classify maps an OS error to a hosterr code.
func classify(op string, err error) error {
	var he *hosterr.Error
	if errors.As(err, &he) {
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EEXIST:
			return hosterr.New(hosterr.Exists, op, err)
		case syscall.ENOENT, syscall.ENODEV, syscall.ENXIO:
			return hosterr.New(hosterr.NotFound, op, err)
		case syscall.EUSERS, syscall.ENOSPC, syscall.EDQUOT, syscall.ENOMEM:
			// mdev core answers EUSERS when available_instances is 0;
			// NVIDIA's driver ENOSPC/ENOMEM when the framebuffer is gone.
			return hosterr.New(hosterr.NoCapacity, op, err)
		case syscall.EBUSY:
			return hosterr.New(hosterr.InUse, op, err)
		case syscall.EINVAL:
			return hosterr.New(hosterr.Invalid, op, err)
		case syscall.EACCES, syscall.EPERM, syscall.EROFS:
			return hosterr.New(hosterr.PermissionDenied, op, err)
		case syscall.EOPNOTSUPP:
			return hosterr.New(hosterr.Unsupported, op, err)
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return hosterr.New(hosterr.NotFound, op, err)
	}
	if errors.Is(err, fs.ErrPermission) {
		return hosterr.New(hosterr.PermissionDenied, op, err)
	}
	return hosterr.New(hosterr.Internal, op, err)
}
