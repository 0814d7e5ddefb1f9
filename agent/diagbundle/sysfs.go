// SPDX-License-Identifier: Apache-2.0

package diagbundle

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// sysfsDirs are where mdevs, their parents and NVIDIA's VFs are.
var sysfsDirs = []string{"bus/mdev/devices", "class/mdev_bus", "bus/pci/devices"}

const (
	maxAttrBytes = 4 << 10
	maxDepth     = 3
)

// skipAttr are binary, slow or write-only attributes.
var skipAttr = map[string]bool{"config": true, "rom": true, "vpd": true, "remove": true, "reset": true, "rescan": true}

// SysfsState lists the readable small attributes of mdevs, mdev parents
// and NVIDIA PCI functions (vendor 0x10de) under root, as "path: value"
// lines, following only the top-level device links.
func SysfsState(root string) ([]byte, error) {
	if root == "" {
		return nil, errors.New("no sysfs root configured")
	}
	var b strings.Builder
	found := false
	for _, d := range sysfsDirs {
		ents, err := os.ReadDir(filepath.Join(root, d))
		if err != nil {
			fmt.Fprintf(&b, "# %s: %v\n", d, err)
			continue
		}
		for _, e := range ents {
			dev := filepath.Join(root, d, e.Name())
			if d == "bus/pci/devices" {
				if v, _ := os.ReadFile(filepath.Join(dev, "vendor")); strings.TrimSpace(string(v)) != "0x10de" {
					continue
				}
			}
			found = true
			fmt.Fprintf(&b, "## %s/%s\n", d, e.Name())
			dumpDir(&b, dev, filepath.Join(d, e.Name()), 0)
		}
	}
	if !found {
		b.WriteString("# no mdev, mdev parent or NVIDIA PCI function\n")
	}
	return []byte(b.String()), nil
}

func dumpDir(b *strings.Builder, dir, rel string, depth int) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintf(b, "%s: %v\n", rel, err)
		return
	}
	slices.SortFunc(ents, func(x, y fs.DirEntry) int { return strings.Compare(x.Name(), y.Name()) })
	for _, e := range ents {
		p, r := filepath.Join(dir, e.Name()), rel+"/"+e.Name()
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			if t, err := os.Readlink(p); err == nil {
				fmt.Fprintf(b, "%s -> %s\n", r, t)
			}
		case e.IsDir():
			if depth+1 < maxDepth {
				dumpDir(b, p, r, depth+1)
			}
		case e.Type().IsRegular() && !skipAttr[e.Name()] && !strings.HasPrefix(e.Name(), "resource"):
			info, err := e.Info()
			if err != nil || info.Size() > maxAttrBytes || info.Mode().Perm()&0o444 == 0 {
				continue
			}
			v, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			fmt.Fprintf(b, "%s: %s\n", r, strings.TrimRight(string(v), "\n"))
		}
	}
}
