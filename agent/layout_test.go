package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var h200PF = pci.MustParse("0000:c1:00.0")

// emptyH200 is a host with one H200-like PF, 8 VFs enabled, none typed.
func emptyH200(t *testing.T, current map[string]string) *fakehost.Host {
	t.Helper()
	spec := fakehost.Spec{Host: "layout-0", DriverVersion: "580.65.05",
		VFIOGPUs: []fakehost.VFIOGPU{{Addr: h200PF, Name: "NVIDIA H200", DeviceID: "0x2335", MemoryMB: 143771, TotalVFs: 16, NumVFs: 8,
			IOMMUGroup: 120, BAR1MB: 262144, Types: fakehost.H200Types(), Current: current}}}
	h, err := fakehost.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// vfTypes reads current_vgpu_type of the PF's VFs from the fake sysfs.
func vfTypes(t *testing.T, h *fakehost.Host) []string {
	t.Helper()
	var out []string
	for _, vf := range h.Spec.VFIOGPUs[0].VFs() {
		b, err := os.ReadFile(filepath.Join(h.SysRoot, "bus", "pci", "devices", vf.String(), "nvidia", "current_vgpu_type"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.TrimSpace(string(b)))
	}
	return out
}

func mustLayout(t *testing.T, items ...string) VFLayout {
	t.Helper()
	l, err := ParseVFLayout(items)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestParseVFLayout(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want VFLayout
		bad  string
	}{
		{in: []string{"0000:c1:00.0=1430:4"}, want: VFLayout{{PF: h200PF, Type: "1430", Count: 4}}},
		{in: []string{"0000:C1:00.0 = nvidia-1429 : 2", "0000:c2:00.0=1428:1"},
			want: VFLayout{{PF: h200PF, Type: "1429", Count: 2}, {PF: pci.MustParse("0000:c2:00.0"), Type: "1428", Count: 1}}},
		{in: []string{"0000:c1:00.0=1430"}, bad: "PF=TYPE:COUNT"},
		{in: []string{"c1=1430:4"}, bad: "c1"},
		{in: []string{"0000:c1:00.0=H200X-35C:4"}, bad: "type id"},
		{in: []string{"0000:c1:00.0=1430:0"}, bad: "at least 1"},
		{in: []string{"0000:c1:00.0=1430:2", "0000:c1:00.0=1429:1"}, bad: "appears twice"},
	} {
		got, err := ParseVFLayout(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("%q: err = %v, want one naming %q", tc.in, err, tc.bad)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%q = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestVFLayoutOptionChecked(t *testing.T) {
	f := filepath.Join(t.TempDir(), "agent.conf")
	os.WriteFile(f, []byte("[devices]\nvf_layout = 0000:c1:00.0=1430:4\n"), 0o644)
	v, err := LoadConfig(conf.Source{File: f})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := VFLayoutFrom(v); err != nil || len(l) != 1 || l[0].Count != 4 {
		t.Errorf("vf_layout = %v, %v", l, err)
	}
	os.WriteFile(f, []byte("[devices]\nvf_layout = 0000:c1:00.0=1430\n"), 0o644)
	if _, err := LoadConfig(conf.Source{File: f}); err == nil || !strings.Contains(err.Error(), "vf_layout") {
		t.Errorf("bad vf_layout: err = %v", err)
	}
}

func TestApplyVFLayoutTypesThenIsIdempotent(t *testing.T) {
	ctx := context.Background()
	h := emptyH200(t, nil)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	res, err := ApplyVFLayout(ctx, h.Sysfs, mustLayout(t, "0000:c1:00.0=1430:4"), LayoutOptions{}, log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := vfTypes(t, h), []string{"1430", "1430", "1430", "1430", "0", "0", "0", "0"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("VF types = %v, want %v", got, want)
	}
	if h.Kernel.Writes != 4 || len(res.Steps) != 4 || res.Steps[0].Action != "set_type" {
		t.Errorf("writes = %d, steps = %v", h.Kernel.Writes, res.Steps)
	}
	if n := strings.Count(logs.String(), "VF typed"); n != 4 {
		t.Errorf("%d VF typed log lines, want 4:\n%s", n, logs.String())
	}

	res, err = ApplyVFLayout(ctx, h.Sysfs, mustLayout(t, "0000:c1:00.0=1430:4"), LayoutOptions{}, discard())
	if err != nil {
		t.Fatal(err)
	}
	if h.Kernel.Writes != 4 {
		t.Errorf("second apply wrote %d times", h.Kernel.Writes-4)
	}
	for _, st := range res.Steps {
		if st.Action != "keep" {
			t.Errorf("second apply step %v, want keep only", st)
		}
	}
}

func TestApplyVFLayoutKeepsVFsOfTheTypeAndAddsTheRest(t *testing.T) {
	h := emptyH200(t, map[string]string{"0000:c1:00.5": "1429"})
	if _, err := ApplyVFLayout(context.Background(), h.Sysfs, mustLayout(t, "0000:c1:00.0=nvidia-1429:2"), LayoutOptions{}, discard()); err != nil {
		t.Fatal(err)
	}
	if got, want := vfTypes(t, h), []string{"1429", "1429", "0", "0", "0", "0", "0", "0"}; fmt.Sprint(got) != fmt.Sprint(want) || h.Kernel.Writes != 1 {
		t.Errorf("VF types = %v (writes %d), want %v after 1 write", got, h.Kernel.Writes, want)
	}
}

func TestApplyVFLayoutRefusesWhatTheGPUCannotHold(t *testing.T) {
	for _, tc := range []struct {
		name    string
		current map[string]string
		layout  string
		problem string
	}{
		{"more VFs of a type than the framebuffer holds", nil, "0000:c1:00.0=1430:5", "holds at most 4"},
		{"the whole GPU twice", nil, "0000:c1:00.0=1428:2", "holds at most 1"},
		{"a type the GPU does not offer", nil, "0000:c1:00.0=1500:1", "not creatable"},
		{"more VFs than the PF has", nil, "0000:c1:00.0=1431:17", "at most 16 (sriov_totalvfs)"},
		{"more VFs than are enabled", nil, "0000:c1:00.0=1431:9", "8 VFs enabled, the layout needs 9"},
		{"a PF that is not there", nil, "0000:c2:00.0=1431:1", "not an NVIDIA SR-IOV GPU"},
		{"a VF of another type, maybe in use", map[string]string{"0000:c1:00.4": "1429"}, "0000:c1:00.0=1430:2", "is never changed"},
		{"a type no longer creatable next to typed VFs", map[string]string{"0000:c1:00.4": "1429", "0000:c1:00.5": "1429"}, "0000:c1:00.0=1429:3", "not creatable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := emptyH200(t, tc.current)
			before := vfTypes(t, h)
			for _, dry := range []bool{true, false} {
				_, err := ApplyVFLayout(context.Background(), h.Sysfs, mustLayout(t, tc.layout), LayoutOptions{DryRun: dry}, discard())
				var refused *LayoutRefusedError
				if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.problem) {
					t.Errorf("dry=%v: err = %v, want a refusal naming %q", dry, err, tc.problem)
				}
			}
			if h.Kernel.Writes != 0 || fmt.Sprint(vfTypes(t, h)) != fmt.Sprint(before) {
				t.Errorf("refused layout wrote %d times: VF types %v, were %v", h.Kernel.Writes, vfTypes(t, h), before)
			}
		})
	}
}

func TestCheckVFLayoutWritesNothing(t *testing.T) {
	h := emptyH200(t, nil)
	res, err := ApplyVFLayout(context.Background(), h.Sysfs, mustLayout(t, "0000:c1:00.0=1431:8"), LayoutOptions{DryRun: true}, discard())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 8 || res.Steps[7].Action != "set_type" || res.Steps[7].VF != pci.MustParse("0000:c1:01.3") {
		t.Errorf("steps = %v", res.Steps)
	}
	if h.Kernel.Writes != 0 {
		t.Errorf("check wrote %d times", h.Kernel.Writes)
	}
}

func TestApplyVFLayoutEnablesVFsFromZero(t *testing.T) {
	spec := fakehost.Spec{Host: "layout-0", VFIOGPUs: []fakehost.VFIOGPU{{Addr: h200PF, Name: "NVIDIA H200", DeviceID: "0x2335",
		MemoryMB: 143771, TotalVFs: 16, NumVFs: 0, IOMMUGroup: 120, Types: fakehost.H200Types()}}}
	h, err := fakehost.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	host := &enablingHost{LayoutHost: h.Sysfs, t: t, fake: h}
	res, err := ApplyVFLayout(context.Background(), host, mustLayout(t, "0000:c1:00.0=1430:2"), LayoutOptions{DryRun: true}, discard())
	if err != nil || len(res.Steps) != 1 || res.Steps[0].Action != "enable_vfs" || len(res.Pending) != 1 || host.enabled != 0 {
		t.Fatalf("check on a PF without VFs: %v, %v (enabled %d)", res, err, host.enabled)
	}
	res, err = ApplyVFLayout(context.Background(), host, mustLayout(t, "0000:c1:00.0=1430:2"), LayoutOptions{}, discard())
	if err != nil {
		t.Fatal(err)
	}
	if host.enabled != 2 || len(res.Steps) != 3 {
		t.Errorf("enabled %d VFs, steps %v", host.enabled, res.Steps)
	}
	if got := vfTypes(t, host.fake); fmt.Sprint(got) != "[1430 1430]" {
		t.Errorf("VF types = %v", got)
	}
}

// enablingHost plays the kernel's part of sriov_numvfs, which the fake
// host does not simulate: the write is made through the fake sysfs and
// the fake host is then rebuilt with that many VFs.
type enablingHost struct {
	LayoutHost
	t       *testing.T
	fake    *fakehost.Host
	enabled int
}

func (e *enablingHost) SetNumVFs(ctx context.Context, pf pci.Addr, n int) error {
	if err := e.fake.Sysfs.SetNumVFs(ctx, pf, n); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(e.fake.SysRoot, "bus", "pci", "devices", pf.String(), "sriov_numvfs"))
	if err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(n) {
		e.t.Errorf("sriov_numvfs = %q, %v; want %d", b, err, n)
	}
	spec := e.fake.Spec
	spec.VFIOGPUs[0].NumVFs = n
	h, err := fakehost.Build(e.fake.Dir, spec)
	if err != nil {
		return err
	}
	e.fake, e.LayoutHost, e.enabled = h, h.Sysfs, n
	return nil
}

// failingHost fails the nth SetVFType with a type, as a driver that
// refuses midway would.
type failingHost struct {
	LayoutHost
	n, calls int
}

func (f *failingHost) SetVFType(ctx context.Context, vf pci.Addr, typeID string) error {
	if typeID != "0" {
		f.calls++
		if f.calls == f.n {
			return fmt.Errorf("write current_vgpu_type: invalid argument")
		}
	}
	return f.LayoutHost.SetVFType(ctx, vf, typeID)
}

func TestApplyVFLayoutUndoesItsTypingWhenTheDriverRefuses(t *testing.T) {
	h := emptyH200(t, nil)
	_, err := ApplyVFLayout(context.Background(), &failingHost{LayoutHost: h.Sysfs, n: 3}, mustLayout(t, "0000:c1:00.0=1430:4"), LayoutOptions{}, discard())
	if err == nil || !strings.Contains(err.Error(), "2 VF(s) typed before were cleared") {
		t.Errorf("err = %v", err)
	}
	if got := vfTypes(t, h); fmt.Sprint(got) != "[0 0 0 0 0 0 0 0]" {
		t.Errorf("VF types after the undo = %v", got)
	}
}
