// Package protocol holds the messages exchanged by the bridge and the
// agents over RabbitMQ (package agent/protocol): commands, results and reports,
// and the names of the exchange, queues and routing keys. Both sides
// import it; it imports nothing of the project.
package protocol

import (
	"encoding/json"
	"time"
)

// Version is the message schema's major version, carried in "v": a
// receiver refuses any other.
const Version = 1

// Minor is the schema's minor version, carried in "minor" (absent: 0). A
// minor only adds fields, which receivers of the minor before ignore; a
// receiver accepts its own minor and the one before (AcceptedMinor), so
// the bridge can be upgraded first and the agents after it. The bridge
// writes each host's commands at that host's reported minor.
//
// Minor 1: "minor" itself, the vGPUs' encoder_percent and decoder_percent
// in reports, and frame_rate_limit in attach_vgpu.
const Minor = 1

// AcceptedMinor reports whether a message of minor m (of Version) can be
// read: this side's minor or the one before.
func AcceptedMinor(m int) bool { return m == Minor || m == Minor-1 }

// Topology names.
const (
	Exchange      = "vgpu"
	ResultsQueue  = "vgpu.bridge.results"
	ReportsQueue  = "vgpu.bridge.reports"
	ResultsBind   = "result.#"
	ReportsBind   = "report.#"
	commandPrefix = "agent."
)

// CommandRoutingKey is the routing key of commands for host.
func CommandRoutingKey(host string) string { return commandPrefix + host }

// AgentQueue is the durable queue of host's commands.
func AgentQueue(host string) string { return "vgpu.agent." + host }

// ResultRoutingKey is the routing key of host's results.
func ResultRoutingKey(host string) string { return "result." + host }

// ReportRoutingKey is the routing key of host's reports.
func ReportRoutingKey(host string) string { return "report." + host }

// Kind is a command kind.
type Kind string

// Command kinds.
const (
	CreateMdev         Kind = "create_mdev"
	RemoveMdev         Kind = "remove_mdev"
	AttachVGPU         Kind = "attach_vgpu"
	DetachVGPU         Kind = "detach_vgpu"
	SetVGPUScheduler   Kind = "set_vgpu_scheduler"
	SetClocks          Kind = "set_clocks"
	ResetClocks        Kind = "reset_clocks"
	SetVMLimits        Kind = "set_vm_limits"
	VerifyVGPU         Kind = "verify_vgpu"
	CollectDiagnostics Kind = "collect_diagnostics"
	// UpgradeDriver runs the agent's own configured driver-upgrade
	// command ([DEFAULT] driver_upgrade_command); the bridge names only
	// the target branch, never a command.
	UpgradeDriver Kind = "upgrade_driver"
	// RetypeGPUs runs the agent's own configured re-type command
	// ([DEFAULT] gpu_retype_command) with the nova.conf change that
	// re-types Nova-owned mdev GPUs of the host (vgpuctl fleet retype);
	// the bridge sends the change, never a command.
	RetypeGPUs Kind = "retype_gpus"
)

// Kinds lists every command kind.
var Kinds = []Kind{CreateMdev, RemoveMdev, AttachVGPU, DetachVGPU, SetVGPUScheduler,
	SetClocks, ResetClocks, SetVMLimits, VerifyVGPU, CollectDiagnostics, UpgradeDriver, RetypeGPUs}

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// Command is what the bridge asks an agent to do.
type Command struct {
	V            int             `json:"v"`
	Minor        int             `json:"minor,omitempty"`
	ID           string          `json:"id"`
	Kind         Kind            `json:"kind"`
	Host         string          `json:"host"`
	RequestID    string          `json:"request_id,omitempty"`
	InstanceUUID string          `json:"instance_uuid,omitempty"`
	IssuedAt     time.Time       `json:"issued_at"`
	ExpiresAt    time.Time       `json:"expires_at"`
	Params       json.RawMessage `json:"params,omitempty"`
	KeyID        string          `json:"key_id"`
	Sig          string          `json:"sig"`
}

// Attach modes.
const (
	ModeLive   = "live"
	ModeConfig = "config"
	ModeCold   = "cold"
)

// MdevParams are the params of create_mdev and remove_mdev. For vendor
// VFIO GPUs, ParentPCI is the VF and TypeID is the numeric vGPU type.
type MdevParams struct {
	MdevUUID   string `json:"mdev_uuid"`
	ParentPCI  string `json:"parent_pci"`
	TypeID     string `json:"type_id"`
	VendorVFIO bool   `json:"vendor_vfio,omitempty"`
}

// AttachParams are the params of attach_vgpu and detach_vgpu. The domain
// is the command's instance_uuid. For an mdev, MdevUUID names it; when
// ParentPCI and TypeID are given too and the mdev does not exist yet,
// attach_vgpu creates it first (and the agent's journal owns it). For a
// vendor-VFIO GPU, VendorVFIO is set, ParentPCI is the VF and TypeID its
// numeric vGPU type (set on the VF first when given).
type AttachParams struct {
	MdevUUID   string `json:"mdev_uuid,omitempty"`
	ParentPCI  string `json:"parent_pci,omitempty"`
	TypeID     string `json:"type_id,omitempty"`
	VendorVFIO bool   `json:"vendor_vfio,omitempty"`
	Mode       string `json:"mode"`
	// ShutdownTimeoutSeconds bounds the graceful shutdown of a cold attach;
	// 0 takes the agent's [DEFAULT] cold_shutdown_timeout.
	ShutdownTimeoutSeconds int `json:"shutdown_timeout_seconds,omitempty"`
	// FrameRateLimit, when set, turns NVIDIA's frame-rate limiter of the
	// vGPU on or off before it is attached: "frame_rate_limiter=1|0" in the
	// device's nvidia/vgpu_params, which the vGPU manager reads when the
	// VM opens the device. Unset leaves vgpu_params as it is.
	FrameRateLimit *bool `json:"frame_rate_limit,omitempty"`
}

// VGPUParams is the nvidia/vgpu_params text for a frame-rate limiter
// setting.
func VGPUParams(frameRateLimit bool) string {
	if frameRateLimit {
		return "frame_rate_limiter=1"
	}
	return "frame_rate_limiter=0"
}

// SchedulerParams are the params of set_vgpu_scheduler.
type SchedulerParams struct {
	GPUPCI      string `json:"gpu_pci"`
	Policy      string `json:"policy"` // best_effort | equal_share | fixed_share
	TimesliceUs uint32 `json:"timeslice_us,omitempty"`
}

// ClockParams are the params of set_clocks and reset_clocks.
type ClockParams struct {
	GPUPCI string `json:"gpu_pci"`
	// MemoryMHz 0 keeps the GPU's memory clock as it is.
	MemoryMHz uint32 `json:"memory_mhz,omitempty"`
	SMMHz     uint32 `json:"sm_mhz,omitempty"`
}

// LimitParams are the params of set_vm_limits.
type LimitParams struct {
	CPUMax     string `json:"cpu_max,omitempty"`     // cgroup v2 form: "200000 100000"
	MemoryHigh string `json:"memory_high,omitempty"` // bytes or "max"
}

// VerifyParams are the params of verify_vgpu: the instance's domain must
// have at least Count (default 1) healthy vGPUs of TypeID (any type when
// empty); MdevUUID, when set, must be one of them.
type VerifyParams struct {
	TypeID   string `json:"type_id,omitempty"`
	Count    int    `json:"count,omitempty"`
	MdevUUID string `json:"mdev_uuid,omitempty"`
}

// DiagnosticsParams are the params of collect_diagnostics.
type DiagnosticsParams struct {
	// Checks limits the run to these check names; empty runs them all.
	Checks []string `json:"checks,omitempty"`
	// Bundle asks for the whole diagnostics bundle (a tar.gz within the
	// agent's [diagnostics] max_bundle_bytes) in the result's details
	// (BundleDetails) besides the checks. The command's instance_uuid,
	// when set, limits the domain XML to that instance. An agent that
	// predates it ignores it and answers the checks only.
	Bundle bool `json:"bundle,omitempty"`
}

// UpgradeParams are the params of upgrade_driver. Branch is the target
// driver branch ("570"), Version an optional exact version
// ("570.133.10"); the agent passes them to its configured command in the
// environment (VGPU_TARGET_BRANCH, VGPU_TARGET_VERSION), never as a
// command line.
type UpgradeParams struct {
	Branch  string `json:"branch"`
	Version string `json:"version,omitempty"`
}

// RetypeParams are the params of retype_gpus: the GPUs to re-type and
// NovaConf, the [devices] and [mdev_<type>] sections of the host's
// nova.conf after the change (placement/novaconf). The agent hands them
// to its configured command: NovaConf on its standard input and in
// VGPU_NOVA_CONF, the GPUs in VGPU_RETYPE_GPUS (one "PCI=TYPE" a line)
// and VGPU_RETYPE_TRAITS (one "PROVIDER_UUID FROM_TRAIT TO_TRAIT" a line, "-" for
// one unknown),
// never as a command line. The result's details are UpgradeDetails.
type RetypeParams struct {
	GPUs     []RetypeGPU `json:"gpus"`
	NovaConf string      `json:"nova_conf"`
}

// RetypeGPU is one GPU of a retype_gpus command.
type RetypeGPU struct {
	PCI          string `json:"pci_address"`
	From         string `json:"from_type,omitempty"`
	To           string `json:"to_type"`
	Provider     string `json:"provider,omitempty"`
	ProviderUUID string `json:"provider_uuid,omitempty"`
	FromTrait    string `json:"from_trait,omitempty"`
	ToTrait      string `json:"to_trait"`
}

// MaxNovaConf bounds a retype_gpus command's nova.conf change.
const MaxNovaConf = 64 << 10

// UpgradeDetails are the details of an upgrade_driver result: the
// command's exit status and its output (stdout and stderr together, the
// last MaxUpgradeOutput bytes; Truncated says how many were dropped).
type UpgradeDetails struct {
	Command    string `json:"command"`
	ExitStatus int    `json:"exit_status"`
	Output     string `json:"output"`
	Truncated  int    `json:"truncated_bytes,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	Branch     string `json:"branch"`
	Version    string `json:"version,omitempty"`
}

// MaxUpgradeOutput bounds the output an upgrade_driver result keeps.
const MaxUpgradeOutput = 32 << 10

// BundleDetails are the details of a collect_diagnostics result that
// asked for a bundle.
type BundleDetails struct {
	Bundle       []byte          `json:"bundle"` // base64 in JSON
	BundleSHA256 string          `json:"bundle_sha256"`
	Manifest     json.RawMessage `json:"manifest,omitempty"`
}

// Status is a result status.
type Status string

// Result statuses.
const (
	Succeeded Status = "succeeded"
	Failed    Status = "failed"
	Refused   Status = "refused"
)

// Result is an agent's answer to a command.
type Result struct {
	V           int             `json:"v"`
	Minor       int             `json:"minor,omitempty"`
	CommandID   string          `json:"command_id"`
	Host        string          `json:"host"`
	Status      Status          `json:"status"`
	Code        string          `json:"code,omitempty"`
	NvidiaCode  int             `json:"nvidia_code,omitempty"`
	Message     string          `json:"message,omitempty"`
	Remediation string          `json:"remediation,omitempty"`
	Details     json.RawMessage `json:"details,omitempty"`
	// FinishedAt is when the agent recorded the result; a duplicate
	// delivery is answered with the same result, FinishedAt included.
	FinishedAt time.Time `json:"finished_at,omitzero"`
	KeyID      string    `json:"key_id,omitempty"`
	Sig        string    `json:"sig,omitempty"`
}

// Report is an agent's periodic picture of its host.
type Report struct {
	V             int    `json:"v"`
	Minor         int    `json:"minor,omitempty"`
	Host          string `json:"host"`
	Node          string `json:"node"`
	AgentVersion  string `json:"agent_version"`
	DriverVersion string `json:"driver_version,omitempty"`
	CgroupVersion int    `json:"cgroup_version,omitempty"`
	// Hypervisor is what libvirt runs ("KVM (QEMU 8.2.2)"), for NVIDIA's
	// compatibility matrix.
	Hypervisor string    `json:"hypervisor,omitempty"`
	SentAt     time.Time `json:"sent_at"`
	Seq        uint64    `json:"seq"`
	GPUs       []GPU     `json:"gpus"`
	// Errors lists what could not be read this time (e.g. "nvml: unavailable");
	// the report is still true for the rest.
	Errors []string `json:"errors,omitempty"`
	KeyID  string   `json:"key_id,omitempty"`
	Sig    string   `json:"sig,omitempty"`
}

// GPU is one physical GPU (or vendor-VFIO VF) in a report.
type GPU struct {
	PCI        string `json:"pci"` // 0000:3b:00.0
	UUID       string `json:"uuid,omitempty"`
	Name       string `json:"name,omitempty"`
	VendorVFIO bool   `json:"vendor_vfio,omitempty"`
	PhysFn     string `json:"physfn,omitempty"` // the PF of a vendor-VFIO VF
	// FreeVFs are, for a vendor-VFIO GPU (PCI is its PF), its VFs that
	// have no vGPU type set: those a bridge-owned GPU's attach may type.
	FreeVFs []string `json:"free_vfs,omitempty"`
	// DeviceID is the GPU's PCI device id (the PF's, 4 hex digits such as
	// "2335") and VFDeviceID its VFs' (a vendor-VFIO GPU), which Nova's
	// [pci] device_spec and alias match as product_id (vgpuctl host
	// layout). Added without a minor: a bridge before them ignores them.
	DeviceID   string `json:"device_id,omitempty"`
	VFDeviceID string `json:"vf_device_id,omitempty"`
	// EnabledType is the type the agent's allow-list gives this GPU, as
	// Nova's [devices] enabled_mdev_types and [mdev_<type>]
	// device_addresses do (the agent's are a copy of them): the type Nova
	// offers on it, among the several in Types. Empty when the list names
	// none for it (or allows everything).
	EnabledType   string     `json:"enabled_type,omitempty"`
	DriverVersion string     `json:"driver_version,omitempty"`
	Types         []VGPUType `json:"types"`
	Active        []VGPU     `json:"active"`
	Health        string     `json:"health"` // ok | degraded | failed | unknown
	// Fault is why the GPU is "failed" when NVML told a fault: the
	// bridge then marks it (no new vGPU there, Nova's scheduler kept off).
	// Added without a minor: a bridge before it reads the report as before.
	Fault          *GPUFault `json:"fault,omitempty"`
	UtilPercent    *float64  `json:"util_percent,omitempty"`
	MemoryUsedMiB  *uint64   `json:"memory_used_mib,omitempty"`
	MemoryTotalMiB *uint64   `json:"memory_total_mib,omitempty"`
	TemperatureC   *int      `json:"temperature_c,omitempty"`
	PowerW         *float64  `json:"power_w,omitempty"`
}

// GPUFault is a GPU fault an agent reports.
type GPUFault struct {
	// Source: "xid", "ecc", "row_remap", "retired_pages" or "gpu_lost".
	Source string `json:"source"`
	Xid    uint64 `json:"xid,omitempty"`
	// Reason is for people: "Xid 79: GPU has fallen off the bus".
	Reason string `json:"reason"`
}

// Health values of a GPU.
const (
	HealthOK       = "ok"
	HealthDegraded = "degraded"
	HealthFailed   = "failed"
	HealthUnknown  = "unknown"
)

// VGPUType is a vGPU type a GPU offers.
type VGPUType struct {
	ID                 string `json:"id"`   // nvidia-232, or a vendor VFIO numeric id
	Name               string `json:"name"` // GRID T4-4Q
	FramebufferMiB     int    `json:"framebuffer_mib,omitempty"`
	MaxInstances       int    `json:"max_instances,omitempty"`
	AvailableInstances int    `json:"available_instances"`
}

// VGPU is an active vGPU.
type VGPU struct {
	MdevUUID     string `json:"mdev_uuid,omitempty"`
	PCI          string `json:"pci,omitempty"` // the VF of a vendor-VFIO vGPU
	TypeID       string `json:"type_id"`
	InstanceUUID string `json:"instance_uuid,omitempty"`
	// Owner is "agent" for mdevs the agent's journal holds, "nova" otherwise.
	Owner string `json:"owner"`
	// GuestDriver is the NVIDIA driver the guest loaded ("550.54.15"), as
	// NVML reports it once the guest driver runs.
	GuestDriver string `json:"guest_driver,omitempty"`
	// UtilPercent (NVML's SM sample of the vGPU) and FBUsedMiB (its
	// framebuffer in use) are its load, when NVML answers.
	UtilPercent *float64 `json:"util_percent,omitempty"`
	FBUsedMiB   *uint64  `json:"fb_used_mib,omitempty"`
	// EncoderPercent and DecoderPercent are its video encoder and decoder
	// utilisation (NVML's vGPU sample), when NVML answers.
	EncoderPercent *float64 `json:"encoder_percent,omitempty"`
	DecoderPercent *float64 `json:"decoder_percent,omitempty"`
}

// Owners of a vGPU.
const (
	OwnerAgent = "agent"
	OwnerNova  = "nova"
)
