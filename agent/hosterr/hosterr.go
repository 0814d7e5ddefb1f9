// Package hosterr gives every host driver of the agent (sysfs, libvirt,
// NVML, cgroups) one vocabulary of error codes. Codes are stable strings: they
// travel in command results (the "code" of a result) and operators grep for them.
//
// A driver returns an *Error wrapping the cause; callers switch on
// CodeOf(err) or test with errors.Is against the package's sentinels:
//
//	if errors.Is(err, hosterr.ErrNoCapacity) { … }
package hosterr

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable error code.
type Code string

// The codes. Values are part of the agent's result contract: never rename one.
const (
	// Exists: the object (mdev UUID, VF type, hostdev) is already there.
	Exists Code = "exists"
	// NotFound: parent GPU, type, mdev, VF, domain or device does not exist.
	NotFound Code = "not_found"
	// NoCapacity: no available instances or framebuffer left (NVIDIA label 48).
	NoCapacity Code = "no_capacity"
	// InUse: the device is busy (mdev attached to a running VM, VF in use).
	InUse Code = "in_use"
	// Unsupported: the hypervisor or driver refuses the operation as unsupported.
	Unsupported Code = "unsupported"
	// VFIOUnavailable: libvirt/QEMU cannot assign the device because VFIO is
	// missing ("Mediated host device assignment requires VFIO support";
	// the hot-add failure, NVIDIA label 62).
	VFIOUnavailable Code = "vfio_unavailable"
	// DomainNotRunning: a live operation on a domain that is shut off.
	DomainNotRunning Code = "domain_not_running"
	// Invalid: a malformed argument (bad UUID, bad type id, bad policy).
	Invalid Code = "invalid_argument"
	// PermissionDenied: the agent lacks the privilege (EACCES/EPERM).
	PermissionDenied Code = "permission_denied"
	// NVMLUnavailable: NVML could not be initialised or is not configured.
	NVMLUnavailable Code = "nvml_unavailable"
	// Timeout: an operation with a deadline (graceful shutdown) ran out.
	Timeout Code = "timeout"
	// Internal: anything not classified above.
	Internal Code = "host_error"
)

// Error is a classified host error.
type Error struct {
	Code Code
	Op   string // what was attempted, e.g. "create mdev 0000:3b:00.0/nvidia-232"
	Err  error  // the cause; may be nil
}

func (e *Error) Error() string {
	switch {
	case e.Op == "" && e.Err == nil:
		return string(e.Code)
	case e.Err == nil:
		return fmt.Sprintf("%s: %s", e.Op, e.Code)
	case e.Op == "":
		return e.Err.Error()
	}
	return fmt.Sprintf("%s: %v", e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, hosterr.ErrNotFound) match any *Error of that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Err == nil && t.Code == e.Code
}

// Sentinels for errors.Is.
var (
	ErrExists           = &Error{Code: Exists}
	ErrNotFound         = &Error{Code: NotFound}
	ErrNoCapacity       = &Error{Code: NoCapacity}
	ErrInUse            = &Error{Code: InUse}
	ErrUnsupported      = &Error{Code: Unsupported}
	ErrVFIOUnavailable  = &Error{Code: VFIOUnavailable}
	ErrDomainNotRunning = &Error{Code: DomainNotRunning}
	ErrInvalid          = &Error{Code: Invalid}
	ErrPermission       = &Error{Code: PermissionDenied}
	ErrNVMLUnavailable  = &Error{Code: NVMLUnavailable}
	ErrTimeout          = &Error{Code: Timeout}
)

// New returns a classified error.
func New(code Code, op string, cause error) error {
	return &Error{Code: code, Op: op, Err: cause}
}

// Errorf returns a classified error with a formatted message as its cause.
func Errorf(code Code, op, format string, args ...any) error {
	return &Error{Code: code, Op: op, Err: fmt.Errorf(format, args...)}
}

// CodeOf returns the code of the outermost *Error in err's chain, "" for nil,
// and Internal for an unclassified error.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// Is reports whether err carries code.
func Is(err error, code Code) bool { return err != nil && CodeOf(err) == code }

// NvidiaCode is the NVIDIA/seed label that goes with a code in results and
// diagnostics, or 0. These are labels, not NVIDIA API values: 43 is the
// Windows device-manager code a guest shows on a driver mismatch (never
// produced by a host operation, so not returned here); 48 framebuffer or
// instances exhausted; 62 hot-add failure; 74 licence failure.
func NvidiaCode(c Code) int {
	switch c {
	case NoCapacity:
		return 48
	case VFIOUnavailable:
		return 62
	}
	return 0
}

// Remediation is a one-line fix a person can follow for a code, or "".
func Remediation(c Code) string {
	switch c {
	case Exists:
		return "The device already exists; nothing to do, or remove it first if it belongs to this agent's journal."
	case NotFound:
		return "Check the PCI address, type id, mdev UUID or domain UUID against `vgpu-agent inventory`."
	case NoCapacity:
		return "No instances of this vGPU type are left on the GPU: pick another GPU or free an mdev (see `vgpu-agent diagnose`)."
	case InUse:
		return "The device is attached to a VM; detach it from the domain first."
	case Unsupported:
		return "The hypervisor refuses this operation; use mode=cold (shutdown, define, start) or check libvirt/QEMU versions."
	case VFIOUnavailable:
		return "Load vfio, vfio_pci and nvidia_vgpu_vfio (or vendor VFIO) modules, enable the IOMMU (intel_iommu=on / amd_iommu=on) and check /dev/vfio."
	case DomainNotRunning:
		return "The domain is shut off: use mode=config, or start the domain first."
	case Invalid:
		return "Fix the command parameters."
	case PermissionDenied:
		return "Run vgpu-agent as root (or with CAP_SYS_ADMIN) and check SELinux/AppArmor labels on sysfs and /dev/vfio."
	case NVMLUnavailable:
		return "Install the NVIDIA vGPU host driver (libnvidia-ml.so.1) and check `nvidia-smi`, or set [nvml] backend = none."
	case Timeout:
		return "The guest did not shut down in time; raise the timeout or check the guest's ACPI handling."
	}
	return ""
}
