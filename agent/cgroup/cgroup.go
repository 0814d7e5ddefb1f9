// Package cgroup sets a VM's CPU and memory limits through the cgroup
// filesystem (root injectable: "/sys/fs/cgroup" on a host): cgroup v2
// cpu.max and memory.high of the domain's systemd scope under machine.slice,
// named by libvirt as machine-qemu\x2d<id>\x2d<name>.scope. It is the
// fallback when libvirt's tunables cannot do it.
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
)

// Version is the cgroup hierarchy in use.
type Version string

// Versions.
const (
	V1      Version = "v1"
	V2      Version = "v2"
	Unknown Version = "unknown"
)

// FS is a cgroup filesystem root.
type FS struct{ root string }

// New returns the cgroup filesystem at root.
func New(root string) *FS { return &FS{root: root} }

// Version detects the hierarchy: v2 when the root has cgroup.controllers
// (unified), v1 when it has per-controller directories.
func (f *FS) Version() Version {
	if _, err := os.Stat(filepath.Join(f.root, "cgroup.controllers")); err == nil {
		return V2
	}
	for _, c := range []string{"cpu", "memory", "cpu,cpuacct"} {
		if st, err := os.Stat(filepath.Join(f.root, c)); err == nil && st.IsDir() {
			return V1
		}
	}
	return Unknown
}

// VersionString is Version as a string, for inventory reports.
func (f *FS) VersionString() string { return string(f.Version()) }

// Escape is systemd's unit-name escaping of a domain name as libvirt uses
// it: '-' and characters outside [A-Za-z0-9:_.] become \xNN.
func Escape(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == ':', c == '_', c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String()
}

// ScopeDir finds the scope directory of a running QEMU domain by name.
func (f *FS) ScopeDir(ctx context.Context, domainName string) (string, error) {
	op := "find cgroup of " + domainName
	if f.Version() != V2 {
		return "", hosterr.Errorf(hosterr.Unsupported, op, "cgroup %s: only cgroup v2 is supported", f.Version())
	}
	re := regexp.MustCompile(`^machine-qemu\\x2d[0-9]+\\x2d` + regexp.QuoteMeta(Escape(domainName)) + `\.scope$`)
	ents, err := os.ReadDir(filepath.Join(f.root, "machine.slice"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", hosterr.Errorf(hosterr.DomainNotRunning, op, "no machine.slice")
		}
		return "", hosterr.New(hosterr.Internal, op, err)
	}
	for _, e := range ents {
		if e.IsDir() && re.MatchString(e.Name()) {
			return filepath.Join(f.root, "machine.slice", e.Name()), nil
		}
	}
	return "", hosterr.Errorf(hosterr.DomainNotRunning, op, "no scope for %s under machine.slice (domain not running?)", domainName)
}

// ValidCPUMax checks a cpu.max value: "QUOTA PERIOD" or "max PERIOD" (or "max").
func ValidCPUMax(s string) error {
	f := strings.Fields(s)
	if len(f) < 1 || len(f) > 2 {
		return fmt.Errorf("cpu.max %q: want \"QUOTA PERIOD\" or \"max PERIOD\"", s)
	}
	if f[0] != "max" {
		if n, err := strconv.ParseUint(f[0], 10, 64); err != nil || n == 0 {
			return fmt.Errorf("cpu.max quota %q", f[0])
		}
	}
	if len(f) == 2 {
		if n, err := strconv.ParseUint(f[1], 10, 64); err != nil || n < 1000 || n > 1000000 {
			return fmt.Errorf("cpu.max period %q (1000…1000000 µs)", f[1])
		}
	}
	return nil
}

// ValidMemoryHigh checks a memory.high value: bytes or "max".
func ValidMemoryHigh(s string) error {
	if s == "max" {
		return nil
	}
	if _, err := strconv.ParseUint(s, 10, 64); err != nil {
		return fmt.Errorf("memory.high %q: want bytes or \"max\"", s)
	}
	return nil
}

// SetLimits writes cpu.max and/or memory.high (empty = leave) of a domain's scope.
func (f *FS) SetLimits(ctx context.Context, domainName, cpuMax, memoryHigh string) error {
	op := "set cgroup limits of " + domainName
	if err := ctx.Err(); err != nil {
		return err
	}
	if cpuMax != "" {
		if err := ValidCPUMax(cpuMax); err != nil {
			return hosterr.New(hosterr.Invalid, op, err)
		}
	}
	if memoryHigh != "" {
		if err := ValidMemoryHigh(memoryHigh); err != nil {
			return hosterr.New(hosterr.Invalid, op, err)
		}
	}
	dir, err := f.ScopeDir(ctx, domainName)
	if err != nil {
		return err
	}
	write := func(file, v string) error {
		fh, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return hosterr.Errorf(hosterr.Unsupported, op, "%s missing: controller not enabled for the scope", file)
			}
			if errors.Is(err, fs.ErrPermission) {
				return hosterr.New(hosterr.PermissionDenied, op, err)
			}
			return hosterr.New(hosterr.Internal, op, err)
		}
		_, werr := fh.WriteString(v)
		if cerr := fh.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return hosterr.New(hosterr.Internal, op, werr)
		}
		return nil
	}
	if cpuMax != "" {
		if err := write("cpu.max", cpuMax); err != nil {
			return err
		}
	}
	if memoryHigh != "" {
		if err := write("memory.high", memoryHigh); err != nil {
			return err
		}
	}
	return nil
}

// Limits reads back cpu.max and memory.high of a domain's scope.
func (f *FS) Limits(ctx context.Context, domainName string) (cpuMax, memoryHigh string, err error) {
	dir, err := f.ScopeDir(ctx, domainName)
	if err != nil {
		return "", "", err
	}
	c, _ := os.ReadFile(filepath.Join(dir, "cpu.max"))
	m, _ := os.ReadFile(filepath.Join(dir, "memory.high"))
	return strings.TrimSpace(string(c)), strings.TrimSpace(string(m)), nil
}
