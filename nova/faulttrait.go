package nova

// GPUFaultTrait is the bridge's own trait on the Placement provider of a
// GPU its agent reported faulted (a fatal Xid, an uncorrectable ECC error,
// a row remap or retired pages pending, the GPU lost). Every vGPU flavor
// `vgpuctl flavor plan` proposes forbids it
// (trait:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden), so Nova's scheduler
// keeps off the GPU until an operator undrains it (`vgpuctl gpu
// undrain`), which removes the trait. It is the one trait the bridge
// writes on Nova-owned providers, with no opt-in, and only on GPU
// providers; it never changes their inventory.
const GPUFaultTrait = "CUSTOM_VGPU_BRIDGE_GPU_FAULT"
