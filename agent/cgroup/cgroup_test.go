package cgroup

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
)

func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const scope = `machine.slice/machine-qemu\x2d3\x2dinstance\x2d0000002a.scope`

func TestVersion(t *testing.T) {
	if v := New(tree(t, map[string]string{"cgroup.controllers": "cpu memory"})).Version(); v != V2 {
		t.Errorf("v2 root = %s", v)
	}
	if v := New(tree(t, map[string]string{"cpu/tasks": "", "memory/tasks": ""})).Version(); v != V1 {
		t.Errorf("v1 root = %s", v)
	}
	if v := New(t.TempDir()).Version(); v != Unknown {
		t.Errorf("empty root = %s", v)
	}
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"instance-0000002a": `instance\x2d0000002a`,
		"vm.1":              "vm.1",
		".hidden":           `\x2ehidden`,
		"a b/c":             `a\x20b\x2fc`,
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSetLimits(t *testing.T) {
	ctx := context.Background()
	root := tree(t, map[string]string{
		"cgroup.controllers":   "cpu memory",
		scope + "/cpu.max":     "max 100000\n",
		scope + "/memory.high": "max\n",
		`machine.slice/machine-qemu\x2d4\x2dinstance\x2d0000002ab.scope/cpu.max`: "max 100000\n",
	})
	f := New(root)
	if err := f.SetLimits(ctx, "instance-0000002a", "200000 100000", "8589934592"); err != nil {
		t.Fatal(err)
	}
	c, m, err := f.Limits(ctx, "instance-0000002a")
	if err != nil || c != "200000 100000" || m != "8589934592" {
		t.Errorf("limits = %q %q %v", c, m, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, `machine.slice/machine-qemu\x2d4\x2dinstance\x2d0000002ab.scope/cpu.max`)); string(b) != "max 100000\n" {
		t.Error("wrote to the wrong scope (name prefix)")
	}
	tests := []struct {
		name, dom, cpu, mem string
		want                hosterr.Code
	}{
		{"bad cpu", "instance-0000002a", "lots", "", hosterr.Invalid},
		{"bad period", "instance-0000002a", "1000 10", "", hosterr.Invalid},
		{"bad memory", "instance-0000002a", "", "8G", hosterr.Invalid},
		{"not running", "instance-00000099", "max 100000", "", hosterr.DomainNotRunning},
	}
	for _, tc := range tests {
		if got := hosterr.CodeOf(f.SetLimits(ctx, tc.dom, tc.cpu, tc.mem)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	v1 := New(tree(t, map[string]string{"cpu/tasks": ""}))
	if err := v1.SetLimits(ctx, "x", "max", ""); !errors.Is(err, hosterr.ErrUnsupported) {
		t.Errorf("v1: %v", err)
	}
	// A scope without the memory controller.
	root2 := tree(t, map[string]string{"cgroup.controllers": "cpu", scope + "/cpu.max": "max 100000\n"})
	if err := New(root2).SetLimits(ctx, "instance-0000002a", "", "1048576"); !errors.Is(err, hosterr.ErrUnsupported) {
		t.Errorf("no memory controller: %v", err)
	}
}
