package policy

import "time"

// Event kinds the bridge maps its inputs to. Nova notifications keep their
// event_type ("nova.instance.resize_prep.start"); webhooks are
// "webhook.<type>"; Alertmanager alerts are "alert".
const (
	KindGPURequest = "webhook.GPU_REQUEST"
	KindGPURelease = "webhook.GPU_RELEASE"
	KindGPUResize  = "webhook.GPU_RESIZE"
	KindGPULoad    = "webhook.GPU_LOAD"
	KindAlert      = "alert"
	// KindGPUFault is the bridge's own event, one per instance whose vGPU
	// runs on a GPU its agent reported faulted: labels gpu (PCI address),
	// provider_uuid, host, fault_source, xid and reason. Rules notify the
	// tenant, release the vGPU or move() a direct-path one to a healthy
	// GPU, or wait.
	KindGPUFault = "bridge.GPU_FAULT"
)

// Event is the policy's input, independent of the nova and webhook packages:
// the bridge maps what it received to it. In CEL rules it is `event`, with
// the field names of the cel tags.
type Event struct {
	Kind         string             `json:"kind" cel:"kind"`                             // "nova.instance.resize_prep.start", "webhook.GPU_REQUEST", "alert"
	Source       string             `json:"source,omitempty" cel:"source"`               // webhook source name, "nova", alert receiver
	InstanceUUID string             `json:"instance_uuid,omitempty" cel:"instance_uuid"` // Nova server uuid
	ProjectID    string             `json:"project_id,omitempty" cel:"project_id"`       // Keystone project
	Workload     string             `json:"workload,omitempty" cel:"workload"`           // training, inference, rendering, vdi, gaming
	Profile      string             `json:"profile,omitempty" cel:"profile"`             // requested vGPU profile, e.g. "T4-4Q"
	Count        int                `json:"count,omitempty" cel:"count"`                 // requested vGPUs
	Metrics      map[string]float64 `json:"metrics,omitempty" cel:"metrics"`             // e.g. gpu_util (percent), fb_used_mib
	Labels       map[string]string  `json:"labels,omitempty" cel:"labels"`               // alert labels, image properties
	Status       string             `json:"status,omitempty" cel:"status"`               // alert status: firing, resolved
	GuestDriver  string             `json:"guest_driver,omitempty" cel:"guest_driver"`   // guest driver the VM or image declares, e.g. "470.82.01"
	Tune         *TuneRequest       `json:"tune,omitempty" cel:"tune"`                   // tuning asked for by the event's sender
	Time         time.Time          `json:"time,omitempty" cel:"time"`                   // when it happened; zero means the engine's clock
}

// TuneRequest is tuning an event asks for. Tuning is per physical GPU and
// shared by its tenants, so only operator rules may set it: a request that
// differs from what the operator set is refused with the reason.
type TuneRequest struct {
	Scheduler   string `json:"scheduler,omitempty" cel:"scheduler"`       // best_effort, equal_share, fixed_share
	TimesliceUS int    `json:"timeslice_us,omitempty" cel:"timeslice_us"` // scheduler time slice, µs
	ClocksMHz   int    `json:"clocks_mhz,omitempty" cel:"clocks_mhz"`     // locked graphics clock, MHz; 0 = leave
}

// VGPU is one vGPU (or several of one profile) an instance holds.
type VGPU struct {
	Profile string `json:"profile" cel:"profile"`
	Count   int    `json:"count" cel:"count"`
	GPU     string `json:"gpu,omitempty" cel:"gpu"` // physical GPU PCI address
	// Path is who gave the instance the vGPU: VGPUPathDirect (the
	// bridge attached it; move() can move it) or VGPUPathNova (its
	// flavor's; Nova owns it). "" when unknown (explain input).
	Path string `json:"path,omitempty" cel:"path"`
}

// VGPU paths.
const (
	VGPUPathDirect = "direct"
	VGPUPathNova   = "nova"
)

// Instance is what the state knows of a Nova server. In CEL: `instance`;
// an unknown instance has an empty uuid.
type Instance struct {
	UUID        string `json:"uuid" cel:"uuid"`
	ProjectID   string `json:"project_id" cel:"project_id"`
	Host        string `json:"host,omitempty" cel:"host"` // Nova compute service host
	Flavor      string `json:"flavor,omitempty" cel:"flavor"`
	State       string `json:"state,omitempty" cel:"state"` // Nova vm_state: active, stopped, …
	Workload    string `json:"workload,omitempty" cel:"workload"`
	GuestDriver string `json:"guest_driver,omitempty" cel:"guest_driver"`
	VGPUs       []VGPU `json:"vgpus,omitempty" cel:"vgpus"`
	// Profile is the profile of the instance's first vGPU, "" without one.
	Profile string `json:"profile,omitempty" cel:"profile"`
	// VGPUCount is the number of vGPUs the instance holds.
	VGPUCount int `json:"vgpu_count,omitempty" cel:"vgpu_count"`
}

// GPU is one physical GPU of a host.
type GPU struct {
	Address     string  `json:"address" cel:"address"`                   // PCI address
	Model       string  `json:"model" cel:"model"`                       // "T4", matches catalog.Profile.GPU
	Profile     string  `json:"profile,omitempty" cel:"profile"`         // profile its vGPUs have, "" when empty
	Used        int     `json:"used" cel:"used"`                         // vGPUs in use
	Capacity    int     `json:"capacity" cel:"capacity"`                 // vGPUs of that profile it can hold
	Utilization float64 `json:"utilization,omitempty" cel:"utilization"` // percent
	Scheduler   string  `json:"scheduler,omitempty" cel:"scheduler"`     // vGPU scheduler now set
	TimesliceUS int     `json:"timeslice_us,omitempty" cel:"timeslice_us"`
	ClocksMHz   int     `json:"clocks_mhz,omitempty" cel:"clocks_mhz"`
}

// Host is a compute host. In CEL: `host` (the instance's host; empty name
// when unknown).
type Host struct {
	Name          string `json:"name" cel:"name"`                               // Nova compute service host
	Hypervisor    string `json:"hypervisor,omitempty" cel:"hypervisor"`         // "KVM (QEMU 6)", "VMware ESXi 7.0 U3", "Xen 4.14"
	DriverVersion string `json:"driver_version,omitempty" cel:"driver_version"` // vGPU manager, e.g. "470.82.01"
	GPUs          []GPU  `json:"gpus,omitempty" cel:"gpus"`
}

// Usage is what a project holds now.
type Usage struct {
	VGPUs          int `json:"vgpus"`
	FramebufferMiB int `json:"framebuffer_mib"`
}

// Project is what CEL rules see as `project`: usage and effective quota.
type Project struct {
	ID                string   `json:"id" cel:"id"`
	VGPUs             int      `json:"vgpus" cel:"vgpus"`                                 // in use
	FramebufferGiB    float64  `json:"framebuffer_gib" cel:"framebuffer_gib"`             // in use
	MaxVGPUs          int      `json:"max_vgpus" cel:"max_vgpus"`                         // 0 = unlimited
	MaxFramebufferGiB int      `json:"max_framebuffer_gib" cel:"max_framebuffer_gib"`     // 0 = unlimited
	MaxVGPUsPerVM     int      `json:"max_vgpus_per_vm" cel:"max_vgpus_per_vm"`           // 0 = unlimited
	AllowedSeries     []string `json:"allowed_series,omitempty" cel:"allowed_series"`     // empty = all
	AllowedProfiles   []string `json:"allowed_profiles,omitempty" cel:"allowed_profiles"` // empty = all
	AttachMode        string   `json:"attach_mode" cel:"attach_mode"`
}

// State is the read-only view of the bridge's state the policy reads.
// Implementations must not change while an evaluation runs.
type State interface {
	// Instance returns a Nova server by uuid.
	Instance(uuid string) (Instance, bool)
	// Host returns a compute host by name.
	Host(name string) (Host, bool)
	// Hosts lists the candidate hosts (for driver compatibility), sorted by name.
	Hosts() []Host
	// ProjectUsage returns what a project holds now.
	ProjectUsage(projectID string) Usage
}

// UnifiedLimit is one of Keystone's unified limits on a project's vGPUs
// ([quota] driver = unified_limits, package unifiedlimits) and the
// project's usage of its resource, as the bridge counts it.
type UnifiedLimit struct {
	// Resource is the limit's name: "class:VGPU" (Nova's, every vGPU of
	// the project) or "vgpu:<profile>" (the bridge's, one profile's).
	Resource string
	// Profile is the profile a per-profile limit counts; "" for class:VGPU.
	Profile string
	Limit   int
	Usage   int
}

// LimitState is a State that also holds its project's unified limits:
// with it, every attach and resize is checked against them too
// (oslo_limit.limit._EnforcerUtils.enforce_limits: usage + delta > limit
// is refused).
type LimitState interface {
	State
	// ProjectLimits returns the project's limits with its usage; nil
	// when the project's limits are not enforced by the bridge.
	ProjectLimits(projectID string) []UnifiedLimit
}

// LoadState is what load rules remember across events.
type LoadState interface {
	// Since returns when rule's condition started to hold for an instance.
	Since(instance, rule string) (time.Time, bool)
	// LastChange returns when the instance's vGPUs were last changed by a
	// decision.
	LastChange(instance string) (time.Time, bool)
}
