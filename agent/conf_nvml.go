package agent

import "github.com/vgpu-bridge/vgpu-bridge/internal/conf"

var optNVMLBackend = nvmlOptions.Choice("nvml", "backend", "nvml", []string{"nvml", "mock", "none"},
	"NVML access: nvml loads the driver's libnvidia-ml.so.1 (when that fails the agent runs on and reports no "+
		"NVML data; no NVML call is made after a failed init); mock uses go-nvml's mock filled with vGPU data "+
		"(the fake host's GPUs); none disables GPU telemetry and tuning. Example: none")

// nvmlOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var nvmlOptions = conf.NewGroup().
	SectionHelp("nvml", "NVIDIA Management Library: GPU inventory, health, metrics, vGPU scheduler and clocks.")
