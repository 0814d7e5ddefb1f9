package sysfs

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// BAR is one memory region of a PCI function, from its "resource" file.
type BAR struct {
	Index int    `json:"index"`
	Size  uint64 `json:"size"`
}

// BARs reads the non-empty regions of a PCI function's resource file.
func (h *Host) BARs(ctx context.Context, a pci.Addr) ([]BAR, error) {
	f, err := os.Open(h.path("bus", "pci", "devices", a.String(), "resource"))
	if err != nil {
		return nil, classify("read resources of "+a.String(), err)
	}
	defer f.Close()
	var out []BAR
	sc := bufio.NewScanner(f)
	for i := 0; sc.Scan(); i++ {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		start, e1 := strconv.ParseUint(strings.TrimPrefix(fs[0], "0x"), 16, 64)
		end, e2 := strconv.ParseUint(strings.TrimPrefix(fs[1], "0x"), 16, 64)
		if e1 != nil || e2 != nil || end <= start {
			continue
		}
		out = append(out, BAR{Index: i, Size: end - start + 1})
	}
	return out, sc.Err()
}

// IOMMUGroups counts /sys/kernel/iommu_groups entries; 0 means the IOMMU is off.
func (h *Host) IOMMUGroups(ctx context.Context) (int, error) {
	ents, err := os.ReadDir(h.path("kernel", "iommu_groups"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, classify("list iommu groups", err)
	}
	return len(ents), nil
}

// IOMMUGroupOf returns the IOMMU group number of a PCI function, or -1.
func (h *Host) IOMMUGroupOf(ctx context.Context, a pci.Addr) int {
	g := linkBase(h.path("bus", "pci", "devices", a.String(), "iommu_group"))
	n, err := strconv.Atoi(g)
	if err != nil {
		return -1
	}
	return n
}

// IOMMUGroupMembers lists the PCI functions in an IOMMU group.
func (h *Host) IOMMUGroupMembers(ctx context.Context, group int) ([]pci.Addr, error) {
	ents, err := os.ReadDir(h.path("kernel", "iommu_groups", strconv.Itoa(group), "devices"))
	if err != nil {
		return nil, classify("list iommu group "+strconv.Itoa(group), err)
	}
	var out []pci.Addr
	for _, e := range ents {
		if a, err := pci.Parse(e.Name()); err == nil {
			out = append(out, a)
		}
	}
	return out, nil
}

// ModuleLoaded reports whether /sys/module/<name> exists (loaded or built in).
func (h *Host) ModuleLoaded(name string) bool {
	_, err := os.Stat(filepath.Join(h.path("module"), name))
	return err == nil
}

// DriverOf returns the bound driver's name of a PCI function, or "".
func (h *Host) DriverOf(a pci.Addr) string {
	return linkBase(h.path("bus", "pci", "devices", a.String(), "driver"))
}
