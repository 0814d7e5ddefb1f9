package nova

import "strconv"

// GuestDriverTraitPrefix starts the traits that say which guest driver
// release branches a GPU's host serves: CUSTOM_VGPU_GUEST_DRIVER_R535 on a
// GPU provider means a guest with a 535 driver works on it. The bridge
// keeps them on GPU providers, and on their hosts' compute node providers,
// with [placement] add_driver_traits (opt-in);
// a flavor asking for it in the request group of its VGPU
// (trait1:CUSTOM_VGPU_GUEST_DRIVER_R535=required beside resources1:VGPU;
// `vgpuctl flavor plan --driver-branch 535` proposes such flavors) keeps
// Nova's scheduler off hosts whose vGPU manager cannot serve that driver.
// An image's trait:…=required does too, with any vGPU flavor: Nova puts
// an image's traits in the unnumbered group, which the compute node meets.
const GuestDriverTraitPrefix = "CUSTOM_VGPU_GUEST_DRIVER_R"

// MaxDriverBranch is the highest guest driver release branch a flavor
// plan takes (branches have at most 4 digits: 535, 550, 570).
const MaxDriverBranch = 9999

// GuestDriverTrait is the trait of guest driver branch b.
func GuestDriverTrait(branch int) string { return GuestDriverTraitPrefix + strconv.Itoa(branch) }
