package sysfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// VFType is one line of creatable_vgpu_types: "1428 : NVIDIA H200X-141C".
type VFType struct {
	ID   string `json:"id"`   // "1428"
	Name string `json:"name"` // "NVIDIA H200X-141C"
}

// VF is an SR-IOV virtual function with NVIDIA's vendor VFIO interface.
type VF struct {
	Addr   pci.Addr `json:"address"`
	PhysFn pci.Addr `json:"physfn"` // zero when the function has no physfn link
	// DeviceID is the VF's PCI device id ("0x2335"): what Nova's [pci]
	// device_spec and alias match as product_id; it may differ from the PF's.
	DeviceID  string   `json:"device_id,omitempty"`
	Creatable []VFType `json:"creatable"` // empty when only the header is present
	// Current is current_vgpu_type; "" when it reads 0 (no vGPU on this VF).
	Current     string `json:"current,omitempty"`
	CurrentName string `json:"current_name,omitempty"` // looked up from Creatable/known names when possible
}

// PF is an SR-IOV physical function (a physical GPU with VFs).
type PF struct {
	Addr     pci.Addr   `json:"address"`
	VendorID string     `json:"vendor_id,omitempty"`
	DeviceID string     `json:"device_id,omitempty"`
	Driver   string     `json:"driver,omitempty"`
	TotalVFs int        `json:"sriov_totalvfs"`
	NumVFs   int        `json:"sriov_numvfs"`
	VFs      []pci.Addr `json:"vfs"`
}

// ParseCreatableTypes parses creatable_vgpu_types. The file has a header line
// ("ID    : vGPU Name") followed by one "<id> : <name>" line per type that can
// be created now; only the header means none can. Lines whose id is not a
// decimal number are skipped (the header); an error names the first line that
// looks like data but has no separator.
func ParseCreatableTypes(s string) ([]VFType, error) {
	out := []VFType{}
	var firstErr error
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		id, name, ok := strings.Cut(line, ":")
		id, name = strings.TrimSpace(id), strings.TrimSpace(name)
		if _, err := strconv.ParseUint(id, 10, 32); err != nil {
			continue // header or noise
		}
		if !ok || name == "" {
			if firstErr == nil {
				firstErr = fmt.Errorf("creatable_vgpu_types: bad line %q", line)
			}
			continue
		}
		out = append(out, VFType{ID: id, Name: name})
	}
	return out, firstErr
}

// FormatCreatableTypes writes types in the driver's layout (used by fakes).
func FormatCreatableTypes(types []VFType) string {
	var b strings.Builder
	b.WriteString("ID    : vGPU Name\n")
	for _, t := range types {
		fmt.Fprintf(&b, "%-5s : %s\n", t.ID, t.Name)
	}
	return b.String()
}

func (h *Host) pciDevices() ([]string, error) {
	ents, err := os.ReadDir(h.path("bus", "pci", "devices"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// VFs lists PCI functions with NVIDIA's vendor VFIO files, sorted by address.
func (h *Host) VFs(ctx context.Context) ([]VF, error) {
	names, err := h.pciDevices()
	if err != nil {
		return nil, classify("list pci devices", err)
	}
	var out []VF
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		a, err := pci.Parse(n)
		if err != nil {
			continue
		}
		vf, ok, err := h.vf(a)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, vf)
		}
	}
	slices.SortFunc(out, func(a, b VF) int { return compareAddr(a.Addr, b.Addr) })
	return out, nil
}

func (h *Host) vf(a pci.Addr) (VF, bool, error) {
	dir := h.path("bus", "pci", "devices", a.String())
	nv := filepath.Join(dir, "nvidia")
	b, err := os.ReadFile(filepath.Join(nv, "creatable_vgpu_types"))
	if errors.Is(err, fs.ErrNotExist) {
		return VF{}, false, nil
	}
	if err != nil {
		return VF{}, false, classify("read vf "+a.String(), err)
	}
	vf := VF{Addr: a}
	vf.Creatable, _ = ParseCreatableTypes(string(b))
	cur, err := readString(filepath.Join(nv, "current_vgpu_type"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return VF{}, false, classify("read vf "+a.String(), err)
	}
	if cur != "0" {
		vf.Current = cur
		for _, t := range vf.Creatable {
			if t.ID == cur {
				vf.CurrentName = t.Name
			}
		}
	}
	vf.DeviceID, _ = readString(filepath.Join(dir, "device"))
	if pf := linkBase(filepath.Join(dir, "physfn")); pf != "" {
		vf.PhysFn, _ = pci.Parse(pf)
	}
	return vf, true, nil
}

// PFs lists SR-IOV physical functions (sriov_totalvfs present, no physfn)
// whose vendor is NVIDIA (0x10de), sorted by address.
func (h *Host) PFs(ctx context.Context) ([]PF, error) {
	names, err := h.pciDevices()
	if err != nil {
		return nil, classify("list pci devices", err)
	}
	var out []PF
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		a, err := pci.Parse(n)
		if err != nil {
			continue
		}
		dir := h.path("bus", "pci", "devices", n)
		total, err := readInt(filepath.Join(dir, "sriov_totalvfs"))
		if err != nil {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, "physfn")); err == nil {
			continue
		}
		pf := PF{Addr: a, TotalVFs: total, VFs: []pci.Addr{}}
		pf.VendorID, _ = readString(filepath.Join(dir, "vendor"))
		if pf.VendorID != "" && !strings.EqualFold(pf.VendorID, "0x10de") {
			continue
		}
		pf.DeviceID, _ = readString(filepath.Join(dir, "device"))
		pf.Driver = linkBase(filepath.Join(dir, "driver"))
		pf.NumVFs, _ = readInt(filepath.Join(dir, "sriov_numvfs"))
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "virtfn") {
				continue
			}
			if v, err := pci.Parse(linkBase(filepath.Join(dir, e.Name()))); err == nil {
				pf.VFs = append(pf.VFs, v)
			}
		}
		slices.SortFunc(pf.VFs, compareAddr)
		out = append(out, pf)
	}
	slices.SortFunc(out, func(a, b PF) int { return compareAddr(a.Addr, b.Addr) })
	return out, nil
}

// SetVFType writes typeID to the VF's nvidia/current_vgpu_type; "0" clears it.
// Setting the type the VF already has is a no-op; setting a type on a VF
// that has another is Exists; a type not listed as creatable is NoCapacity
// (the driver lists only what fits now) and clearing an empty VF is a no-op.
func (h *Host) SetVFType(ctx context.Context, vf pci.Addr, typeID string) error {
	op := fmt.Sprintf("set vgpu type %s on vf %s", typeID, vf)
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := strconv.ParseUint(typeID, 10, 32); err != nil {
		return hosterr.Errorf(hosterr.Invalid, op, "type id must be a decimal number, got %q", typeID)
	}
	cur, ok, err := h.vf(vf)
	if err != nil {
		return err
	}
	if !ok {
		return hosterr.Errorf(hosterr.NotFound, op, "%s has no nvidia/creatable_vgpu_types", vf)
	}
	want := typeID
	if n, _ := strconv.ParseUint(typeID, 10, 32); n == 0 {
		want = ""
	}
	switch {
	case cur.Current == want:
		return nil
	case want != "" && cur.Current != "":
		return hosterr.Errorf(hosterr.Exists, op, "vf already has vgpu type %s", cur.Current)
	case want != "" && !slices.ContainsFunc(cur.Creatable, func(t VFType) bool { return t.ID == typeID }):
		return hosterr.Errorf(hosterr.NoCapacity, op, "type %s is not creatable on %s now", typeID, vf)
	}
	p := h.path("bus", "pci", "devices", vf.String(), "nvidia", "current_vgpu_type")
	if err := h.w.WriteFile(p, []byte(typeID)); err != nil {
		return classify(op, err)
	}
	return nil
}

// SetVGPUParams writes params (such as "frame_rate_limiter=0") to a vGPU's
// nvidia/vgpu_params: the mdev's when mdevUUID is set, else the vendor-VFIO
// VF's. The vGPU manager reads the file when a VM opens the device, so it
// is written before the attach. A device without the file (not an NVIDIA
// vGPU, or a driver without the attribute) is Unsupported.
func (h *Host) SetVGPUParams(ctx context.Context, mdevUUID string, vf pci.Addr, params string) error {
	var dev, op string
	if mdevUUID != "" {
		if err := validUUID(mdevUUID); err != nil {
			return hosterr.New(hosterr.Invalid, "set vgpu_params", err)
		}
		dev, op = h.path("bus", "mdev", "devices", mdevUUID), "set vgpu_params of mdev "+mdevUUID
	} else {
		dev, op = h.path("bus", "pci", "devices", vf.String()), "set vgpu_params of vf "+vf.String()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := os.Stat(dev); err != nil {
		return classify(op, err)
	}
	p := filepath.Join(dev, "nvidia", "vgpu_params")
	if strings.ContainsAny(params, "\n\x00") {
		return hosterr.Errorf(hosterr.Invalid, op, "params %q hold a newline or NUL", params)
	}
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return hosterr.Errorf(hosterr.Unsupported, op, "%s does not exist: the driver takes no vGPU parameters for this device", p)
		}
		return classify(op, err)
	}
	if err := h.w.WriteFile(p, []byte(params)); err != nil {
		return classify(op, err)
	}
	return nil
}

// SetNumVFs writes n to the PF's sriov_numvfs, enabling n VFs. The kernel
// takes a new count only from 0, so a PF with VFs already enabled is
// Exists unless it has exactly n (a no-op); n above sriov_totalvfs is
// Invalid.
func (h *Host) SetNumVFs(ctx context.Context, pf pci.Addr, n int) error {
	op := fmt.Sprintf("set sriov_numvfs of %s to %d", pf, n)
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := h.path("bus", "pci", "devices", pf.String())
	total, err := readInt(filepath.Join(dir, "sriov_totalvfs"))
	if err != nil {
		return classify(op, err)
	}
	if n < 0 || n > total {
		return hosterr.Errorf(hosterr.Invalid, op, "%s supports 0 to %d VFs", pf, total)
	}
	cur, err := readInt(filepath.Join(dir, "sriov_numvfs"))
	if err != nil {
		return classify(op, err)
	}
	switch {
	case cur == n:
		return nil
	case cur != 0:
		return hosterr.Errorf(hosterr.Exists, op, "%s has %d VFs enabled; the count changes only from 0", pf, cur)
	}
	if err := h.w.WriteFile(filepath.Join(dir, "sriov_numvfs"), []byte(strconv.Itoa(n))); err != nil {
		return classify(op, err)
	}
	return nil
}
