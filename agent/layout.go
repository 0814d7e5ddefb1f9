package agent

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// VFLayoutEntry is one PF=TYPE:COUNT of [devices] vf_layout: COUNT VFs of
// the PF typed TYPE (a decimal vGPU type id).
type VFLayoutEntry struct {
	PF    pci.Addr `json:"pf"`
	Type  string   `json:"type"`
	Count int      `json:"count"`
}

// VFLayout is the declared boot layout of Nova-owned vendor-VFIO GPUs.
type VFLayout []VFLayoutEntry

// ParseVFLayout parses PF=TYPE:COUNT items. The type may be written 1429
// or nvidia-1429; COUNT is at least 1; a PF appears once (one type per GPU).
func ParseVFLayout(items []string) (VFLayout, error) {
	var l VFLayout
	for _, it := range items {
		pfS, rest, ok := strings.Cut(strings.TrimSpace(it), "=")
		typ, countS, ok2 := strings.Cut(rest, ":")
		if !ok || !ok2 {
			return nil, fmt.Errorf("%q: want PF=TYPE:COUNT, such as 0000:c1:00.0=1430:4", it)
		}
		pf, err := pci.Parse(strings.TrimSpace(pfS))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", it, err)
		}
		typ = strings.TrimPrefix(strings.TrimSpace(typ), "nvidia-")
		if n, err := strconv.ParseUint(typ, 10, 32); err != nil || n == 0 {
			return nil, fmt.Errorf("%q: the type must be a vGPU type id such as 1430 or nvidia-1430", it)
		}
		count, err := strconv.Atoi(strings.TrimSpace(countS))
		if err != nil || count < 1 {
			return nil, fmt.Errorf("%q: the count must be a number of VFs, at least 1", it)
		}
		if slices.ContainsFunc(l, func(e VFLayoutEntry) bool { return e.PF == pf }) {
			return nil, fmt.Errorf("%q: %s appears twice; a GPU holds one type", it, pf)
		}
		l = append(l, VFLayoutEntry{PF: pf, Type: typ, Count: count})
	}
	return l, nil
}

// VFLayoutFrom reads [devices] vf_layout.
func VFLayoutFrom(v *conf.Values) (VFLayout, error) { return ParseVFLayout(optVFLayout.Get(v)) }

// LayoutStep is one thing the layout does, or would do, to the host.
type LayoutStep struct {
	// Action is enable_vfs (write sriov_numvfs), set_type (write
	// current_vgpu_type) or keep (the VF has the type already).
	Action string   `json:"action"`
	PF     pci.Addr `json:"pf"`
	VF     pci.Addr `json:"vf,omitzero"`
	Type   string   `json:"type,omitempty"`
	NumVFs int      `json:"num_vfs,omitempty"`
}

func (s LayoutStep) String() string {
	switch s.Action {
	case "enable_vfs":
		return fmt.Sprintf("enable_vfs %s sriov_numvfs=%d", s.PF, s.NumVFs)
	default:
		return fmt.Sprintf("%-10s %s type %s (pf %s)", s.Action, s.VF, s.Type, s.PF)
	}
}

// LayoutResult is what ApplyVFLayout did (or, dry, would do).
type LayoutResult struct {
	Steps    []LayoutStep `json:"steps"`
	Warnings []string     `json:"warnings,omitempty"`
	// Pending: PFs whose VFs are not enabled yet, so that a dry run could
	// not check their types (apply enables them first, then checks).
	Pending []pci.Addr `json:"pending,omitempty"`
}

// LayoutRefusedError is a layout the host cannot hold, refused before
// any VF was typed.
type LayoutRefusedError struct{ Problems []string }

func (e *LayoutRefusedError) Error() string {
	return "vf layout refused, no VF typed: " + strings.Join(e.Problems, "; ")
}

// LayoutHost is the sysfs the layout reads and writes (*sysfs.Host).
type LayoutHost interface {
	PFs(ctx context.Context) ([]sysfs.PF, error)
	VFs(ctx context.Context) ([]sysfs.VF, error)
	SetNumVFs(ctx context.Context, pf pci.Addr, n int) error
	SetVFType(ctx context.Context, vf pci.Addr, typeID string) error
}

// LayoutOptions tune ApplyVFLayout.
type LayoutOptions struct {
	DryRun bool
	// VFWait is how long to wait for enabled VFs to show their
	// nvidia/ files (the driver probes them after sriov_numvfs).
	VFWait time.Duration
	// FakeHostDir, when set, applies the layout to the simulated host
	// there (built when missing) instead of [sysfs] root.
	FakeHostDir string
}

// ApplyLayout applies (or, dry, checks) [devices] vf_layout on the host's
// sysfs ([sysfs] root).
func ApplyLayout(ctx context.Context, v *conf.Values, o LayoutOptions, log *slog.Logger) (LayoutResult, error) {
	l, err := VFLayoutFrom(v)
	if err != nil {
		return LayoutResult{}, fmt.Errorf("[devices] vf_layout: %w", err)
	}
	if len(l) == 0 {
		log.Info("vf layout: [devices] vf_layout is empty, nothing to do")
		return LayoutResult{Steps: []LayoutStep{}}, nil
	}
	if o.FakeHostDir != "" {
		h, err := fakehost.LoadOrBuild(o.FakeHostDir)
		if err != nil {
			return LayoutResult{}, err
		}
		return ApplyVFLayout(ctx, h.Sysfs, l, o, log)
	}
	s, err := hostSettingsFrom(v)
	if err != nil {
		return LayoutResult{}, err
	}
	return ApplyVFLayout(ctx, sysfs.New(s.SysfsRoot), l, o, log)
}

// ApplyVFLayout makes the host's VFs match l: for each PF, VFs are
// enabled when none are (sriov_numvfs from 0 to COUNT), then the first
// COUNT VFs without a type, in address order, are given the layout's type;
// VFs already of that type count and are left alone. It never changes a
// VF that has another type (it may be in use: the layout is refused) and
// never disables VFs. Before typing any VF it refuses a layout the GPU
// cannot hold: a type not creatable, more VFs than the PF has, more VFs
// of a type than the GPU's framebuffer holds (the framebuffer read from
// the type names, "NVIDIA H200X-35C" being 35 GB), a second type on a
// GPU. Should the driver still refuse a type midway, the VFs this run
// typed are cleared again. Each write is logged.
func ApplyVFLayout(ctx context.Context, h LayoutHost, l VFLayout, o LayoutOptions, log *slog.Logger) (LayoutResult, error) {
	res := LayoutResult{Steps: []LayoutStep{}}
	pfs, err := h.PFs(ctx)
	if err != nil {
		return res, fmt.Errorf("vf layout: read PFs: %w", err)
	}
	var problems []string
	var enable []LayoutStep
	for _, e := range l {
		i := slices.IndexFunc(pfs, func(p sysfs.PF) bool { return p.Addr == e.PF })
		if i < 0 {
			problems = append(problems, fmt.Sprintf("%s is not an NVIDIA SR-IOV GPU on this host (no sriov_totalvfs)", e.PF))
			continue
		}
		pf := pfs[i]
		switch {
		case e.Count > pf.TotalVFs:
			problems = append(problems, fmt.Sprintf("%s: %d VFs asked, the GPU has at most %d (sriov_totalvfs)", e.PF, e.Count, pf.TotalVFs))
		case pf.NumVFs == 0:
			enable = append(enable, LayoutStep{Action: "enable_vfs", PF: e.PF, NumVFs: e.Count})
		case pf.NumVFs < e.Count:
			problems = append(problems, fmt.Sprintf("%s: %d VFs enabled, the layout needs %d; the kernel changes the count only from 0 "+
				"(echo 0 > sriov_numvfs once no guest uses a VF, then apply again)", e.PF, pf.NumVFs, e.Count))
		}
	}
	if len(problems) > 0 {
		return res, &LayoutRefusedError{Problems: problems}
	}
	for _, st := range enable {
		res.Steps = append(res.Steps, st)
		if o.DryRun {
			res.Pending = append(res.Pending, st.PF)
			continue
		}
		if err := h.SetNumVFs(ctx, st.PF, st.NumVFs); err != nil {
			return res, fmt.Errorf("vf layout: %w", err)
		}
		log.Info("vf layout: VFs enabled", "pf", st.PF.String(), "sriov_numvfs", st.NumVFs)
	}
	if len(enable) > 0 && !o.DryRun {
		if pfs, err = waitVFs(ctx, h, l, o.VFWait); err != nil {
			return res, err
		}
	}
	vfs, err := h.VFs(ctx)
	if err != nil {
		return res, fmt.Errorf("vf layout: read VFs: %w", err)
	}
	var typing []LayoutStep
	for _, e := range l {
		if slices.Contains(res.Pending, e.PF) {
			continue
		}
		i := slices.IndexFunc(pfs, func(p sysfs.PF) bool { return p.Addr == e.PF })
		steps, warn, probs := planPF(pfs[i], vfs, e)
		typing = append(typing, steps...)
		res.Warnings = append(res.Warnings, warn...)
		problems = append(problems, probs...)
	}
	if len(problems) > 0 {
		return res, &LayoutRefusedError{Problems: problems}
	}
	for _, w := range res.Warnings {
		log.Warn("vf layout: " + w)
	}
	var done []LayoutStep
	for _, st := range typing {
		res.Steps = append(res.Steps, st)
		if o.DryRun || st.Action != "set_type" {
			continue
		}
		if err := h.SetVFType(ctx, st.VF, st.Type); err != nil {
			log.Error("vf layout: typing a VF failed, clearing the VFs this run typed", "vf", st.VF.String(), "type", st.Type, "err", err)
			undoTyping(ctx, h, done, log)
			return res, fmt.Errorf("vf layout: %w (the %d VF(s) typed before were cleared again)", err, len(done))
		}
		done = append(done, st)
		log.Info("vf layout: VF typed", "pf", st.PF.String(), "vf", st.VF.String(), "type", st.Type)
	}
	return res, nil
}

// planPF plans the typing of one PF's VFs.
func planPF(pf sysfs.PF, vfs []sysfs.VF, e VFLayoutEntry) (steps []LayoutStep, warnings, problems []string) {
	var free, have []sysfs.VF
	var creatable []sysfs.VFType
	for _, a := range pf.VFs {
		i := slices.IndexFunc(vfs, func(v sysfs.VF) bool { return v.Addr == a })
		if i < 0 {
			continue // not a vendor-VFIO VF (no nvidia/ files)
		}
		vf := vfs[i]
		switch vf.Current {
		case "":
			free = append(free, vf)
			if creatable == nil {
				creatable = vf.Creatable
			}
		case e.Type:
			have = append(have, vf)
		default:
			problems = append(problems, fmt.Sprintf("%s: VF %s has vGPU type %s, the layout wants %s; a typed VF may be in use and is never changed "+
				"(once no guest uses it: echo 0 > /sys/bus/pci/devices/%s/nvidia/current_vgpu_type)", e.PF, vf.Addr, vf.Current, e.Type, vf.Addr))
		}
	}
	if len(problems) > 0 {
		return nil, nil, problems
	}
	for _, vf := range have {
		if len(steps) < e.Count {
			steps = append(steps, LayoutStep{Action: "keep", PF: e.PF, VF: vf.Addr, Type: e.Type})
		}
	}
	if len(have) > e.Count {
		warnings = append(warnings, fmt.Sprintf("%s: %d VFs have type %s, the layout asks %d; the others are left typed (they may be in use)",
			e.PF, len(have), e.Type, e.Count))
	}
	need := e.Count - len(have)
	if need <= 0 {
		return steps, warnings, nil
	}
	if len(free) < need {
		return nil, nil, []string{fmt.Sprintf("%s: %d more VFs of type %s needed, %d VFs without a type", e.PF, need, e.Type, len(free))}
	}
	i := slices.IndexFunc(creatable, func(t sysfs.VFType) bool { return t.ID == e.Type })
	if i < 0 {
		return nil, nil, []string{fmt.Sprintf("%s: type %s is not creatable on this GPU now (creatable_vgpu_types: %s)", e.PF, e.Type, typeList(creatable))}
	}
	if len(have) == 0 {
		if max, ok := maxInstances(creatable, creatable[i], pf.TotalVFs); ok && e.Count > max {
			return nil, nil, []string{fmt.Sprintf("%s: %d VFs of type %s (%s) asked, the GPU holds at most %d", e.PF, e.Count, e.Type, creatable[i].Name, max)}
		}
	}
	for _, vf := range free[:need] {
		steps = append(steps, LayoutStep{Action: "set_type", PF: e.PF, VF: vf.Addr, Type: e.Type})
	}
	return steps, warnings, nil
}

// typeSize reads the framebuffer, in GB, from an NVIDIA type name:
// "NVIDIA H200X-35C" → 35.
var typeSize = regexp.MustCompile(`-(\d+)[A-Z]+$`)

func sizeOf(name string) (int, bool) {
	m := typeSize.FindStringSubmatch(strings.TrimSpace(name))
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil && n > 0
}

// maxInstances is how many VFs of t an empty GPU holds: its framebuffer
// (the largest type it can create when empty, which is the whole GPU)
// over t's, and no more than its VFs. ok is false when a name gives no
// size.
func maxInstances(creatable []sysfs.VFType, t sysfs.VFType, totalVFs int) (int, bool) {
	size, ok := sizeOf(t.Name)
	if !ok {
		return 0, false
	}
	gpu := 0
	for _, c := range creatable {
		s, ok := sizeOf(c.Name)
		if !ok {
			return 0, false
		}
		gpu = max(gpu, s)
	}
	return min(gpu/size, totalVFs), true
}

func typeList(ts []sysfs.VFType) string {
	if len(ts) == 0 {
		return "none"
	}
	var b []string
	for _, t := range ts {
		b = append(b, t.ID+" "+t.Name)
	}
	return strings.Join(b, ", ")
}

// undoTyping clears the VFs this run typed, newest first.
func undoTyping(ctx context.Context, h LayoutHost, done []LayoutStep, log *slog.Logger) {
	for i := len(done) - 1; i >= 0; i-- {
		st := done[i]
		if err := h.SetVFType(ctx, st.VF, "0"); err != nil {
			log.Error("vf layout: clearing a VF this run typed failed", "vf", st.VF.String(), "err", err)
			continue
		}
		log.Info("vf layout: VF cleared again", "vf", st.VF.String())
	}
}

// waitVFs waits until every PF of l lists as many VFs with nvidia/ files
// as its entry needs (the driver probes VFs after sriov_numvfs is set).
func waitVFs(ctx context.Context, h LayoutHost, l VFLayout, wait time.Duration) ([]sysfs.PF, error) {
	if wait <= 0 {
		wait = 30 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		pfs, err := h.PFs(ctx)
		if err != nil {
			return nil, fmt.Errorf("vf layout: read PFs: %w", err)
		}
		vfs, err := h.VFs(ctx)
		if err != nil {
			return nil, fmt.Errorf("vf layout: read VFs: %w", err)
		}
		var missing []string
		for _, e := range l {
			i := slices.IndexFunc(pfs, func(p sysfs.PF) bool { return p.Addr == e.PF })
			n := 0
			for _, a := range pfs[i].VFs {
				if slices.ContainsFunc(vfs, func(v sysfs.VF) bool { return v.Addr == a }) {
					n++
				}
			}
			if n < e.Count {
				missing = append(missing, fmt.Sprintf("%s has %d of %d VFs with nvidia/creatable_vgpu_types", e.PF, n, e.Count))
			}
		}
		if len(missing) == 0 {
			return pfs, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("vf layout: VFs enabled but not ready after %s (is the NVIDIA vGPU manager loaded?): %s",
				wait, strings.Join(missing, "; "))
		}
		if !wake.Wait(ctx, nil, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}
