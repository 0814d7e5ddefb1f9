package libvirt

import (
	"errors"
	"strings"

	lv "libvirt.org/go/libvirt"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
)

// Classify maps a libvirt error to a hosterr code, keeping the libvirt error
// as the cause. Message checks come first because libvirt reuses generic
// codes (VIR_ERR_INTERNAL_ERROR, VIR_ERR_CONFIG_UNSUPPORTED) for them.
func Classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var he *hosterr.Error
	if errors.As(err, &he) {
		return err
	}
	var le lv.Error
	if !errors.As(err, &le) {
		return hosterr.New(hosterr.Internal, op, err)
	}
	return hosterr.New(codeOf(le), op, err)
}

func codeOf(e lv.Error) hosterr.Code {
	msg := strings.ToLower(e.Message)
	switch {
	case strings.Contains(msg, "requires vfio support"),
		strings.Contains(msg, "vfio") && strings.Contains(msg, "not supported"):
		// qemu: "Mediated host device assignment requires VFIO support"
		return hosterr.VFIOUnavailable
	case strings.Contains(msg, "not running"):
		// test driver: "internal error: domain 'x' not running";
		// qemu/test: "Requested operation is not valid: domain is not running"
		return hosterr.DomainNotRunning
	case strings.Contains(msg, "unsupported flags"), strings.Contains(msg, "unsupported configuration"),
		strings.Contains(msg, "does not support hotplugging"):
		// qemu refuses a hot-plug onto a bus without it with an internal
		// error: "unable to execute QEMU command 'device_add': Bus 'pci.0'
		// does not support hotplugging"
		return hosterr.Unsupported
	case strings.Contains(msg, "already running"):
		return hosterr.Exists
	}
	switch e.Code {
	case lv.ERR_NO_SUPPORT, lv.ERR_OPERATION_UNSUPPORTED, lv.ERR_CONFIG_UNSUPPORTED, lv.ERR_ARGUMENT_UNSUPPORTED:
		return hosterr.Unsupported
	case lv.ERR_NO_DOMAIN, lv.ERR_NO_NODE_DEVICE, lv.ERR_DEVICE_MISSING:
		return hosterr.NotFound
	case lv.ERR_OPERATION_TIMEOUT, lv.ERR_AGENT_UNRESPONSIVE:
		return hosterr.Timeout
	case lv.ERR_ACCESS_DENIED, lv.ERR_AUTH_FAILED, lv.ERR_AUTH_UNAVAILABLE:
		return hosterr.PermissionDenied
	case lv.ERR_INVALID_ARG, lv.ERR_XML_ERROR, lv.ERR_XML_DETAIL, lv.ERR_INVALID_DOMAIN:
		return hosterr.Invalid
	case lv.ERR_OPERATION_INVALID:
		return hosterr.Invalid
	}
	return hosterr.Internal
}
