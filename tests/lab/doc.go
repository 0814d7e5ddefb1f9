// Package lab runs the agent against a real kernel: a QEMU VM (tests/lab/lab.sh)
// with Debian 12's 6.1 kernel, systemd as its init, libvirtd, and the kernel's
// sample mediated-device drivers (mtty, mdpy, and mtty_pci, whose mdev parents
// are two emulated PCI functions, QEMU's edu devices, each with types of its
// own: a profile change moves a vGPU from one to the other). TestMain brings
// the lab up (lab.sh up: apt,
// module build and initramfs cached, boot); when it cannot, every test fails
// with the command to start it by hand. The tests carry the build tag lab:
// `make lab-test` (go test -tags lab ./tests/lab/), and `make test` last.
//
// A test that needs the VM's own sysfs runs this test binary inside the VM (the
// binary is copied to the lab's shared directory /lab and run there over ssh
// with VGPU_LAB_VM=1), so the agent's code meets the real kernel unchanged.
package lab
