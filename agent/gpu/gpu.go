// Package gpu reads and tunes physical GPUs through NVML.
//
// A Backend is one of: the real NVML (go-nvml, dlopen of libnvidia-ml.so.1),
// go-nvml's mock filled with vGPU data (tests, the fake host), or None (no
// GPU support configured). The real backend calls Init once; when Init fails
// no other NVML function is ever called (a call after a failed Init kills
// the process) and the agent runs on with None, reporting no GPUs.
package gpu

import (
	"context"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// Backend is the agent's access to NVML.
type Backend interface {
	// GPUs returns every GPU NVML sees, in NVML index order.
	GPUs(ctx context.Context) ([]GPU, error)
	// SetVGPUScheduler sets a GPU's vGPU scheduler: policy is one of
	// "best_effort", "equal_share", "fixed_share"; timesliceUs 0 keeps the
	// driver's default. It returns the state read back after the change.
	SetVGPUScheduler(ctx context.Context, gpu pci.Addr, policy string, timesliceUs uint32) (Applied, error)
	// SetApplicationClocks sets a GPU's application clocks (MHz); memMHz 0
	// keeps the memory clock. It returns the clocks read back.
	SetApplicationClocks(ctx context.Context, gpu pci.Addr, memMHz, smMHz uint32) (Applied, error)
	// ResetApplicationClocks restores the default application clocks and
	// returns them as read back.
	ResetApplicationClocks(ctx context.Context, gpu pci.Addr) (Applied, error)
	// Close releases NVML (Shutdown); a closed backend must not be used.
	Close()
}

// Scheduler policies accepted by SetVGPUScheduler.
const (
	PolicyBestEffort = "best_effort"
	PolicyEqualShare = "equal_share"
	PolicyFixedShare = "fixed_share"
)

// GPU is one physical GPU.
type GPU struct {
	Index         int      `json:"index"`
	Name          string   `json:"name"` // "Tesla T4"
	UUID          string   `json:"uuid"` // "GPU-…"
	Addr          pci.Addr `json:"pci_address"`
	DriverVersion string   `json:"driver_version"`
	// VirtualizationMode: none, passthrough, vgpu, host_vgpu, host_vsga.
	VirtualizationMode string `json:"virtualization_mode,omitempty"`
	// HostVGPUMode: "sriov" (vendor VFIO, vGPU 17+ on Ada/Hopper) or "non_sriov" (mdev).
	HostVGPUMode   string         `json:"host_vgpu_mode,omitempty"`
	SupportedTypes []VGPUType     `json:"supported_types"`
	CreatableTypes []VGPUType     `json:"creatable_types"`
	Active         []VGPUInstance `json:"active_vgpus"`
	// Heterogeneous is the vGPU heterogeneous mode (mixed types on one GPU);
	// nil when the driver does not tell.
	Heterogeneous *bool      `json:"heterogeneous,omitempty"`
	Utilization   Util       `json:"utilization"`
	Memory        Memory     `json:"memory"`
	TemperatureC  uint32     `json:"temperature_c"`
	PowerMW       uint32     `json:"power_mw"`
	Clocks        Clocks     `json:"clocks"`
	Scheduler     *Scheduler `json:"scheduler,omitempty"`
	License       License    `json:"license"`
	// Unavailable lists the NVML queries this GPU/driver did not answer
	// (NOT_SUPPORTED and the like); their fields are zero.
	Unavailable []string `json:"unavailable,omitempty"`
	// Fault, when set, says why the GPU must take no new vGPU: a fatal Xid
	// or ECC event, a counter (uncorrectable ECC, row remap or retired
	// pages pending), or the GPU lost.
	Fault *Fault `json:"fault,omitempty"`
}

// VGPUType is a vGPU profile a GPU supports.
type VGPUType struct {
	ID            uint32 `json:"id"`    // NVML type id; sysfs "nvidia-<id>" for mdev types
	Name          string `json:"name"`  // "GRID T4-4Q", "NVIDIA H200X-141C"
	Class         string `json:"class"` // "Quadro", "Compute", "NVS", "GRID"
	FramebufferMB uint64 `json:"framebuffer_mb"`
	MaxInstances  int    `json:"max_instances"`
}

// VGPUInstance is a running vGPU.
type VGPUInstance struct {
	MdevUUID     string `json:"mdev_uuid,omitempty"`
	UUID         string `json:"uuid,omitempty"`
	VMID         string `json:"vm_id,omitempty"` // the domain UUID (or name), as the driver reports it
	TypeID       uint32 `json:"type_id"`
	TypeName     string `json:"type_name,omitempty"`
	FBUsageBytes uint64 `json:"fb_usage_bytes"`
	// GuestDriverVersion is the guest's NVIDIA driver ("550.54.15"), when it reports one.
	GuestDriverVersion string `json:"guest_driver_version,omitempty"`
	// Licensed is the guest's licence state as the host sees it; nil unknown.
	Licensed       *bool  `json:"licensed,omitempty"`
	UtilizationPct uint32 `json:"utilization_pct"`
	// EncoderPct and DecoderPct are the vGPU's video encoder and decoder
	// utilisation (NVML's vGPU sample).
	EncoderPct uint32 `json:"encoder_pct"`
	DecoderPct uint32 `json:"decoder_pct"`
}

// Util is utilisation in percent over the driver's last sample period.
type Util struct {
	GPU     uint32 `json:"gpu_pct"`
	Memory  uint32 `json:"memory_pct"`
	Encoder uint32 `json:"encoder_pct"`
	Decoder uint32 `json:"decoder_pct"`
}

// Memory is framebuffer memory in bytes.
type Memory struct {
	Total uint64 `json:"total_bytes"`
	Used  uint64 `json:"used_bytes"`
	Free  uint64 `json:"free_bytes"`
}

// Clocks are current and application clocks in MHz.
type Clocks struct {
	SM     uint32 `json:"sm_mhz"`
	Mem    uint32 `json:"mem_mhz"`
	AppSM  uint32 `json:"app_sm_mhz"`
	AppMem uint32 `json:"app_mem_mhz"`
}

// Scheduler is the vGPU scheduler state.
type Scheduler struct {
	Policy      string `json:"policy"`
	TimesliceUs uint32 `json:"timeslice_us,omitempty"`
}

// Applied is what a tuning call left on a GPU, read back from NVML after
// the change: the scheduler, or the application clocks. Changed is false
// when the GPU had the asked-for setting already.
type Applied struct {
	Changed   bool       `json:"changed"`
	Scheduler *Scheduler `json:"scheduler,omitempty"`
	AppSMMHz  uint32     `json:"app_sm_mhz,omitempty"`
	AppMemMHz uint32     `json:"app_mem_mhz,omitempty"`
}

// License is the GPU's vGPU software licence view.
type License struct {
	// Supported: the GPU takes part in vGPU licensing.
	Supported bool `json:"supported"`
	// Unlicensed counts active vGPUs whose guest reports no valid licence.
	Unlicensed int `json:"unlicensed_vgpus"`
}

// DisabledByConfig is None's Reason when the operator turned NVML off.
const DisabledByConfig = "disabled by [nvml] backend = none"

// None is the backend without NVML: no GPUs, every operation refused.
type None struct {
	// Reason says why NVML is not there ("disabled by [nvml] backend", the Init error).
	Reason string
}

var _ Backend = None{}

// GPUs returns none.
func (None) GPUs(context.Context) ([]GPU, error) { return nil, nil }

func (n None) refuse(op string) error {
	r := n.Reason
	if r == "" {
		r = "NVML is not available"
	}
	return hosterr.Errorf(hosterr.NVMLUnavailable, op, "%s", r)
}

// SetVGPUScheduler is refused.
func (n None) SetVGPUScheduler(_ context.Context, a pci.Addr, _ string, _ uint32) (Applied, error) {
	return Applied{}, n.refuse("set vgpu scheduler on " + a.String())
}

// SetApplicationClocks is refused.
func (n None) SetApplicationClocks(_ context.Context, a pci.Addr, _, _ uint32) (Applied, error) {
	return Applied{}, n.refuse("set application clocks on " + a.String())
}

// ResetApplicationClocks is refused.
func (n None) ResetApplicationClocks(_ context.Context, a pci.Addr) (Applied, error) {
	return Applied{}, n.refuse("reset application clocks on " + a.String())
}

// Close does nothing.
func (None) Close() {}
