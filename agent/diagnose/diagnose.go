// Package diagnose runs the agent's host checks for the classic vGPU
// failures and says, for each, how bad it is, what was seen and how to fix
// it: `vgpu-agent diagnose` and the collect_diagnostics command.
//
// NVIDIA codes in results are labels, not NVIDIA API values: 43 is the
// Windows device-manager code a guest shows on a host/guest driver branch
// mismatch; 48 (framebuffer or instances exhausted), 62 (hot-add failure)
// and 74 (licence failure) are this project's own labels.
package diagnose

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

// Severity of a finding.
type Severity string

// Severities, mildest first.
const (
	OK       Severity = "ok"
	Info     Severity = "info"
	Warning  Severity = "warning"
	Error    Severity = "error"
	Critical Severity = "critical"
)

func (s Severity) rank() int {
	return slices.Index([]Severity{OK, Info, Warning, Error, Critical}, s)
}

// Check ids (stable: operators and the bridge select checks by them).
const (
	CheckLibvirt     = "libvirt_available"
	CheckNVML        = "nvml_available"
	CheckDriverMatch = "driver_branch_match" // 43
	CheckCapacity    = "capacity"            // 48
	CheckHotAdd      = "hot_add_prerequisites"
	CheckLicense     = "license" // 74
	CheckBAR         = "bar_size"
	CheckMixedTypes  = "mixed_types"
	CheckOrphans     = "orphan_mdevs"
)

// AllChecks lists every check in the order they run.
var AllChecks = []string{CheckLibvirt, CheckNVML, CheckDriverMatch, CheckCapacity, CheckHotAdd, CheckLicense, CheckBAR, CheckMixedTypes, CheckOrphans}

// Finding is one check's result about one subject.
type Finding struct {
	Check      string   `json:"check"`
	Severity   Severity `json:"severity"`
	Subject    string   `json:"subject,omitempty"` // a GPU address, a vGPU, the host
	Title      string   `json:"title"`
	Evidence   []string `json:"evidence,omitempty"`
	Fix        string   `json:"fix,omitempty"`
	NvidiaCode int      `json:"nvidia_code,omitempty"`
}

// Report is the outcome of a run.
type Report struct {
	Host     string    `json:"host"`
	Worst    Severity  `json:"worst"`
	Findings []Finding `json:"findings"`
}

// Host is what checks read beyond the inventory (*sysfs.Host).
type Host interface {
	IOMMUGroups(ctx context.Context) (int, error)
	IOMMUGroupOf(ctx context.Context, a pci.Addr) int
	IOMMUGroupMembers(ctx context.Context, group int) ([]pci.Addr, error)
	ModuleLoaded(name string) bool
	BARs(ctx context.Context, a pci.Addr) ([]sysfs.BAR, error)
	DriverOf(a pci.Addr) string
}

// Scanner produces the inventory checks look at.
type Scanner interface {
	Scan(ctx context.Context) (*inventory.Inventory, error)
}

// Diagnoser runs checks.
type Diagnoser struct {
	Scanner  Scanner
	Host     Host   // may be nil: host-level checks are skipped
	ProcRoot string // "/proc"; the kernel command line is ProcRoot/cmdline
}

// Diagnose runs the named checks (all when empty) and returns the report as
// JSON (the executor's collect_diagnostics details).
func (d *Diagnoser) Diagnose(ctx context.Context, checks []string) (json.RawMessage, error) {
	r, err := d.Run(ctx, checks)
	if err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// Run runs the named checks (all when empty).
func (d *Diagnoser) Run(ctx context.Context, checks []string) (*Report, error) {
	for _, c := range checks {
		if !slices.Contains(AllChecks, c) {
			return nil, fmt.Errorf("unknown check %q (known: %s)", c, strings.Join(AllChecks, ", "))
		}
	}
	if len(checks) == 0 {
		checks = AllChecks
	}
	inv, err := d.Scanner.Scan(ctx)
	if err != nil {
		return nil, err
	}
	cmdline := ""
	if d.ProcRoot != "" {
		b, _ := os.ReadFile(filepath.Join(d.ProcRoot, "cmdline"))
		cmdline = strings.TrimSpace(string(b))
	}
	r := &Report{Host: inv.Host, Worst: OK, Findings: []Finding{}}
	add := func(f Finding) {
		r.Findings = append(r.Findings, f)
		if f.Severity.rank() > r.Worst.rank() {
			r.Worst = f.Severity
		}
	}
	for _, c := range AllChecks {
		if !slices.Contains(checks, c) {
			continue
		}
		before := len(r.Findings)
		switch c {
		case CheckLibvirt:
			checkLibvirt(inv, add)
		case CheckNVML:
			checkNVML(inv, add)
		case CheckDriverMatch:
			checkDriver(inv, add)
		case CheckCapacity:
			checkCapacity(inv, add)
		case CheckHotAdd:
			d.checkHotAdd(ctx, inv, cmdline, add)
		case CheckLicense:
			checkLicense(inv, add)
		case CheckBAR:
			d.checkBAR(ctx, inv, cmdline, add)
		case CheckMixedTypes:
			checkMixed(inv, add)
		case CheckOrphans:
			checkOrphans(inv, add)
		}
		if len(r.Findings) == before {
			add(Finding{Check: c, Severity: OK, Subject: "host", Title: "no problem found"})
		}
	}
	return r, nil
}

// checkLibvirt: without libvirt the agent can attach nothing and cannot
// tell which domains hold which vGPUs.
func checkLibvirt(inv *inventory.Inventory, add func(Finding)) {
	var ev []string
	for _, e := range inv.Errors {
		if strings.HasPrefix(e, "libvirt: ") {
			ev = append(ev, e)
		}
	}
	if len(ev) == 0 {
		return
	}
	add(Finding{Check: CheckLibvirt, Severity: Critical, Subject: "host", Evidence: ev,
		Title: "libvirt does not answer: no vGPU can be attached or detached, and which domain holds which vGPU is unknown",
		Fix: "Start libvirt (systemctl start libvirtd, or virtqemud.socket on modular daemons) and check [libvirt] uri; " +
			"`virsh -c <uri> list --all` must answer as the agent's user."})
}

func checkNVML(inv *inventory.Inventory, add func(Finding)) {
	if inv.NVML || inv.NVMLError == gpu.DisabledByConfig {
		return // the operator turned NVML off: nothing to say
	}
	sev := Info
	if len(inv.GPUs) > 0 {
		sev = Warning // GPUs in sysfs but no NVML: no telemetry, no tuning
	}
	ev := []string{"NVML not initialised"}
	if inv.NVMLError != "" {
		ev = append(ev, inv.NVMLError)
	}
	add(Finding{Check: CheckNVML, Severity: sev, Subject: "host", Title: "NVML unavailable: no GPU telemetry, vGPU scheduler or clock control",
		Evidence: ev, Fix: "Install the NVIDIA vGPU host driver so libnvidia-ml.so.1 loads (check `nvidia-smi`), or set [nvml] backend = none to silence this."})
}

// branch is the driver's major version ("550.54.15" → 550).
func branch(v string) (int, bool) {
	maj, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(maj)
	return n, err == nil && n > 0
}

// checkDriver applies NVIDIA's rule: a guest driver from the host's branch
// or the previous one is supported; a newer branch than the host's is not
// (the guest's device shows code 43).
func checkDriver(inv *inventory.Inventory, add func(Finding)) {
	for _, g := range inv.GPUs {
		host, ok := branch(g.DriverVersion)
		if !ok {
			continue
		}
		for _, v := range g.VGPUs {
			guest, ok := branch(v.GuestDriver)
			if !ok {
				continue
			}
			ev := []string{fmt.Sprintf("host vGPU manager %s (branch %d) on %s", g.DriverVersion, host, g.Addr),
				fmt.Sprintf("guest driver %s (branch %d) in %s", v.GuestDriver, guest, nonEmpty(v.DomainName, v.Instance))}
			switch {
			case guest > host:
				add(Finding{Check: CheckDriverMatch, Severity: Error, Subject: v.ID, NvidiaCode: 43, Evidence: ev,
					Title: "guest driver is newer than the host's vGPU manager: the guest shows code 43",
					Fix:   fmt.Sprintf("Install a guest driver from branch %d (or %d), or upgrade the host's vGPU manager.", host, host-1)})
			case guest < host-1:
				add(Finding{Check: CheckDriverMatch, Severity: Warning, Subject: v.ID, NvidiaCode: 43, Evidence: ev,
					Title: "guest driver branch is older than the host's previous branch: unsupported",
					Fix:   fmt.Sprintf("Upgrade the guest driver to branch %d.", host)})
			}
		}
	}
}

func checkCapacity(inv *inventory.Inventory, add func(Finding)) {
	for _, g := range inv.GPUs {
		if g.Mode == "none" {
			continue
		}
		var allowed, free int
		var ev []string
		for _, t := range g.Types {
			if !t.Allowed {
				continue
			}
			allowed++
			free += t.Available
			if t.Available == 0 {
				ev = append(ev, fmt.Sprintf("%s (%s): available 0, in use %d", t.ID, t.Name, t.InUse))
			}
		}
		if allowed == 0 || free > 0 {
			continue
		}
		if g.Memory.Total > 0 {
			ev = append(ev, fmt.Sprintf("framebuffer used %d of %d MiB", g.Memory.Used>>20, g.Memory.Total>>20))
		}
		add(Finding{Check: CheckCapacity, Severity: Warning, Subject: g.Addr.String(), NvidiaCode: 48, Evidence: ev,
			Title: "no instances of any enabled vGPU type left: framebuffer exhausted",
			Fix:   "Place new vGPUs on another GPU, remove unused mdevs (see orphan_mdevs), or enable heterogeneous mode / a smaller type."})
	}
}

func (d *Diagnoser) checkHotAdd(ctx context.Context, inv *inventory.Inventory, cmdline string, add func(Finding)) {
	if d.Host == nil {
		return
	}
	fix := "Enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line), load vfio, vfio_pci, vfio_iommu_type1 and the NVIDIA vGPU VFIO module, then retry the attach."
	n, _ := d.Host.IOMMUGroups(ctx)
	if n == 0 {
		ev := []string{"/sys/kernel/iommu_groups is empty"}
		if cmdline != "" {
			ev = append(ev, "kernel command line: "+cmdline)
		}
		add(Finding{Check: CheckHotAdd, Severity: Error, Subject: "host", NvidiaCode: 62, Evidence: ev, Fix: fix,
			Title: "IOMMU is off: vGPUs cannot be assigned (hot-add fails)"})
	}
	var missing []string
	mods := []string{"vfio", "vfio_pci", "vfio_iommu_type1"}
	hasMdev := slices.ContainsFunc(inv.GPUs, func(g inventory.GPU) bool { return g.Mode == "mdev" })
	if hasMdev {
		mods = append(mods, "nvidia_vgpu_vfio")
	}
	for _, m := range mods {
		if !d.Host.ModuleLoaded(m) {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		add(Finding{Check: CheckHotAdd, Severity: Error, Subject: "host", NvidiaCode: 62, Fix: fix,
			Evidence: []string{"not loaded: " + strings.Join(missing, ", ")},
			Title:    "VFIO modules missing: libvirt answers \"Mediated host device assignment requires VFIO support\""})
	}
	// ACS: a GPU sharing its IOMMU group with unrelated devices cannot be
	// isolated; VFs of the same PF and the GPU's own functions are fine.
	for _, g := range inv.GPUs {
		grp := d.Host.IOMMUGroupOf(ctx, g.Addr)
		if grp < 0 {
			continue
		}
		members, _ := d.Host.IOMMUGroupMembers(ctx, grp)
		var others []string
		for _, m := range members {
			if m.Domain == g.Addr.Domain && m.Bus == g.Addr.Bus && m.Slot == g.Addr.Slot {
				continue
			}
			others = append(others, m.String()+" ("+nonEmpty(d.Host.DriverOf(m), "no driver")+")")
		}
		if len(others) > 0 {
			add(Finding{Check: CheckHotAdd, Severity: Warning, Subject: g.Addr.String(), NvidiaCode: 62,
				Evidence: append([]string{fmt.Sprintf("IOMMU group %d also holds:", grp)}, others...),
				Title:    "GPU shares its IOMMU group with other devices (no ACS isolation)",
				Fix:      "Move the GPU to a slot behind an ACS-capable root port, or enable ACS in the BIOS; do not use pcie_acs_override in production."})
		}
	}
}

func checkLicense(inv *inventory.Inventory, add func(Finding)) {
	for _, g := range inv.GPUs {
		for _, v := range g.VGPUs {
			if v.Licensed == nil || *v.Licensed {
				continue
			}
			add(Finding{Check: CheckLicense, Severity: Error, Subject: v.ID, NvidiaCode: 74,
				Evidence: []string{fmt.Sprintf("vGPU %s (%s) in %s reports no valid licence", v.ID, nonEmpty(v.TypeName, v.Type), nonEmpty(v.DomainName, v.Instance, "no domain"))},
				Title:    "vGPU is not licensed: performance is throttled and features are off",
				Fix:      "In the guest, check the NVIDIA licence client (nvidia-gridd, `nvidia-smi -q | grep -i licen`), the client configuration token and the reachability of the licence server (NLS/DLS)."})
		}
	}
}

// checkBAR flags GPUs whose BAR1 exceeds 256 MiB when the kernel may
// reassign PCI resources (no pci=realloc=off): NVIDIA asks for
// pci=realloc=off on such hosts, or vGPU fails to start.
func (d *Diagnoser) checkBAR(ctx context.Context, inv *inventory.Inventory, cmdline string, add func(Finding)) {
	if d.Host == nil || strings.Contains(" "+cmdline+" ", " pci=realloc=off ") || strings.Contains(cmdline, "realloc=off") {
		return
	}
	for _, g := range inv.GPUs {
		bars, err := d.Host.BARs(ctx, g.Addr)
		if err != nil {
			continue
		}
		for _, b := range bars {
			if b.Size > 256<<20 {
				add(Finding{Check: CheckBAR, Severity: Warning, Subject: g.Addr.String(),
					Evidence: []string{fmt.Sprintf("BAR%d is %d MiB", b.Index, b.Size>>20), "kernel command line: " + nonEmpty(cmdline, "(unknown)")},
					Title:    "GPU BAR larger than 256 MB without pci=realloc=off",
					Fix:      "Add pci=realloc=off to the kernel command line (GRUB_CMDLINE_LINUX), update-grub and reboot."})
				break
			}
		}
	}
}

func checkMixed(inv *inventory.Inventory, add func(Finding)) {
	for _, g := range inv.GPUs {
		types := map[string]bool{}
		for _, v := range g.VGPUs {
			types[v.Type] = true
		}
		if len(types) < 2 {
			continue
		}
		var ids []string
		for t := range types {
			ids = append(ids, t)
		}
		slices.Sort(ids)
		sev, title := Error, "mixed vGPU types on one GPU without heterogeneous mode"
		fix := "Move the VMs so each GPU holds one type, or enable heterogeneous mode (nvidia-smi vgpu -shm 1) where the GPU supports it."
		if g.Heterogeneous != nil && *g.Heterogeneous {
			sev, title, fix = Info, "mixed vGPU types on one GPU (heterogeneous mode is on)", ""
		}
		add(Finding{Check: CheckMixedTypes, Severity: sev, Subject: g.Addr.String(), Title: title, Fix: fix,
			Evidence: []string{"types in use: " + strings.Join(ids, ", ")}})
	}
}

func checkOrphans(inv *inventory.Inventory, add func(Finding)) {
	if slices.ContainsFunc(inv.Errors, func(e string) bool { return strings.HasPrefix(e, "libvirt: ") }) {
		add(Finding{Check: CheckOrphans, Severity: Info, Subject: "host",
			Title: "not checked: without libvirt's answer no vGPU is known to be held or not (see libvirt_available)"})
		return
	}
	for _, o := range inv.Orphans {
		add(Finding{Check: CheckOrphans, Severity: Warning, Subject: o,
			Evidence: []string{o + " exists but no libvirt domain uses it"},
			Title:    "vGPU attached to no domain: it holds framebuffer for nobody",
			Fix:      "If this agent created it (see its journal) it is removed on the next reconcile; otherwise remove it by hand: echo 1 > /sys/bus/mdev/devices/<uuid>/remove (or current_vgpu_type 0 for a VF)."})
	}
}

func nonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}
