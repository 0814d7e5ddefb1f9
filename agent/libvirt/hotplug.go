package libvirt

import (
	"context"
	"sync"
	"time"

	lv "libvirt.org/go/libvirt"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
)

// HotPlugger attaches and detaches a hostdev to a running domain, live and
// in its persistent config at once.
type HotPlugger interface {
	AttachLive(ctx context.Context, domainUUID, hostdevXML string) error
	DetachLive(ctx context.Context, domainUUID, hostdevXML string) error
}

// LiveHotPlugger uses virDomainAttachDeviceFlags / DetachDeviceFlags with
// VIR_DOMAIN_AFFECT_LIVE|VIR_DOMAIN_AFFECT_CONFIG.
type LiveHotPlugger struct {
	Conn *Conn
	// DetachWait bounds how long DetachLive waits for the guest to give
	// the device back (0: DefaultDetachWait).
	DetachWait time.Duration
}

// DefaultDetachWait is LiveHotPlugger's wait for a guest to release a
// hot-unplugged device: the guest's kernel must answer QEMU's unplug
// request (ACPI eject or PCIe attention button, the latter with a 5 s
// delay of its own), which a busy guest can take tens of seconds to do.
const DefaultDetachWait = 2 * time.Minute

var _ HotPlugger = LiveHotPlugger{}

// AttachLive hot-adds the device.
func (h LiveHotPlugger) AttachLive(ctx context.Context, domainUUID, hostdevXML string) error {
	op := "attach live to " + domainUUID
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := h.Conn.raw().LookupDomainByUUIDString(domainUUID)
	if err != nil {
		return Classify(op, err)
	}
	defer d.Free()
	return Classify(op, d.AttachDeviceFlags(hostdevXML, lv.DOMAIN_DEVICE_MODIFY_LIVE|lv.DOMAIN_DEVICE_MODIFY_CONFIG))
}

// DetachLive hot-removes the device from the running domain and from its
// persistent config, from whichever of the two still has it, and returns
// once QEMU has let the device go. libvirt's detach only asks: QEMU sends the
// guest an unplug request, libvirt waits a few seconds for the guest's
// answer and then returns success with the device still attached, to be
// removed whenever the guest releases it. Until then the device is still in
// use (the kernel would not let its mdev be removed), so DetachLive waits
// for it to leave the live definition, at most DetachWait, and then fails
// with hosterr.Timeout: the detach stays requested, and a retry finds the
// device only in the live definition and waits again.
func (h LiveHotPlugger) DetachLive(ctx context.Context, domainUUID, hostdevXML string) error {
	op := "detach live from " + domainUUID
	if err := ctx.Err(); err != nil {
		return err
	}
	key, err := hostdevKey(hostdevXML)
	if err != nil {
		return hosterr.New(hosterr.Invalid, op, err)
	}
	d, err := h.Conn.raw().LookupDomainByUUIDString(domainUUID)
	if err != nil {
		return Classify(op, err)
	}
	defer d.Free()
	live, err := hasHostdev(d, key, true)
	if err != nil {
		return Classify(op, err)
	}
	config, err := hasHostdev(d, key, false)
	if err != nil {
		return Classify(op, err)
	}
	var flags lv.DomainDeviceModifyFlags
	if live {
		flags |= lv.DOMAIN_DEVICE_MODIFY_LIVE
	}
	if config {
		flags |= lv.DOMAIN_DEVICE_MODIFY_CONFIG
	}
	if flags == 0 {
		return hosterr.Errorf(hosterr.NotFound, op, "device not found")
	}
	if err := d.DetachDeviceFlags(hostdevXML, flags); err != nil {
		return Classify(op, err)
	}
	if !live {
		return nil
	}
	wait := h.DetachWait
	if wait <= 0 {
		wait = DefaultDetachWait
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(h.Conn.PollInterval)
	defer tick.Stop()
	for {
		still, err := hasHostdev(d, key, true)
		if err != nil {
			return Classify(op, err)
		}
		if !still {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return hosterr.Errorf(hosterr.Timeout, op, "the guest has not released the device after %s (the unplug request stands)", wait)
		case <-tick.C:
		}
	}
}

// hasHostdev reports whether the domain's live (a running domain's current)
// or persistent definition has the hostdev of key.
func hasHostdev(d *lv.Domain, key string, live bool) (bool, error) {
	if live {
		active, err := d.IsActive()
		if err != nil || !active {
			return false, err
		}
	}
	var flags lv.DomainXMLFlags
	if !live {
		flags = lv.DOMAIN_XML_INACTIVE
	}
	x, err := d.GetXMLDesc(flags)
	if err != nil {
		return false, err
	}
	dom, err := ParseDomainXML(x)
	if err != nil {
		return false, err
	}
	for _, h := range dom.Hostdevs {
		if h.key() == key {
			return true, nil
		}
	}
	return false, nil
}

// FakeHotPlugger emulates live hot-plug on a connection whose driver cannot
// (the test driver): it checks what QEMU would (the domain exists and runs,
// a device is not attached twice, a detached device was attached), writes the
// config change through DefineXML and then restarts the domain inside the
// test driver (destroy + create, instantaneous there) so the live definition
// shows the device, as after a real hot-plug. Set an error with SetErr to
// make calls fail, e.g. with the VFIO error a host without VFIO gives.
type FakeHotPlugger struct {
	Conn *Conn

	mu  sync.Mutex
	err error
}

var _ HotPlugger = (*FakeHotPlugger)(nil)

// SetErr programs the error of the following calls (nil clears it).
func (f *FakeHotPlugger) SetErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *FakeHotPlugger) check(ctx context.Context, op, domainUUID, hostdevXML string) (key string, attached bool, err error) {
	if err := ctx.Err(); err != nil {
		return "", false, err
	}
	if f.err != nil {
		return "", false, Classify(op, f.err)
	}
	key, err = hostdevKey(hostdevXML)
	if err != nil {
		return "", false, hosterr.New(hosterr.Invalid, op, err)
	}
	dom, err := f.Conn.Domain(ctx, domainUUID)
	if err != nil {
		return "", false, hosterr.New(hosterr.CodeOf(err), op, err)
	}
	if !dom.Running() {
		return "", false, hosterr.Errorf(hosterr.DomainNotRunning, op, "domain is not running")
	}
	for _, h := range dom.Hostdevs {
		if h.Live && h.key() == key {
			attached = true
		}
	}
	return key, attached, nil
}

// AttachLive adds the hostdev to the config and the live definition.
func (f *FakeHotPlugger) AttachLive(ctx context.Context, domainUUID, hostdevXML string) error {
	op := "attach live to " + domainUUID
	f.mu.Lock()
	defer f.mu.Unlock()
	_, attached, err := f.check(ctx, op, domainUUID, hostdevXML)
	if err != nil {
		return err
	}
	if attached {
		return hosterr.Errorf(hosterr.Exists, op, "device already attached")
	}
	if err := f.Conn.DefineHostdevXML(ctx, domainUUID, hostdevXML); err != nil {
		return err
	}
	return f.restart(op, domainUUID)
}

// DetachLive removes the hostdev from the config and the live definition.
func (f *FakeHotPlugger) DetachLive(ctx context.Context, domainUUID, hostdevXML string) error {
	op := "detach live from " + domainUUID
	f.mu.Lock()
	defer f.mu.Unlock()
	_, attached, err := f.check(ctx, op, domainUUID, hostdevXML)
	if err != nil {
		return err
	}
	if !attached {
		// qemu answers VIR_ERR_DEVICE_MISSING "device not found"
		return hosterr.Errorf(hosterr.NotFound, op, "device not found")
	}
	if err := f.Conn.RemoveHostdevXML(ctx, domainUUID, hostdevXML); err != nil {
		return err
	}
	return f.restart(op, domainUUID)
}

func (f *FakeHotPlugger) restart(op, uuid string) error {
	d, err := f.Conn.raw().LookupDomainByUUIDString(uuid)
	if err != nil {
		return Classify(op, err)
	}
	defer d.Free()
	if err := d.Destroy(); err != nil {
		return Classify(op, err)
	}
	return Classify(op, d.Create())
}
