// Package libvirt is the agent's libvirt driver: it lists domains with their
// mdev and VF hostdevs and the PCI/mdev node devices (parsed with
// libvirtxml), changes a domain's persistent config through DefineXML, hot-plugs
// through a HotPlugger, starts and gracefully stops domains, and sets tunables.
// Every libvirt error leaves through Classify, which gives it a stable
// agent/hosterr code.
//
// libvirt's test driver (test:///abs/path.xml) serves the tests and the fake
// host: it knows domains and node devices but cannot attach or detach devices
// at all (VIR_ERR_NO_SUPPORT), which is why config changes here go through
// DefineXML and live hot-plug sits behind the HotPlugger interface.
package libvirt

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	lv "libvirt.org/go/libvirt"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
)

// Conn is an open libvirt connection. It is safe for concurrent use.
type Conn struct {
	c   *lv.Connect
	uri string
	// PollInterval is how often Shutdown checks the domain's state.
	PollInterval time.Duration
}

// Open connects to uri ("qemu:///system", "test:///abs/path.xml").
// With the test driver, state (defined domains) lives as long as the Conn.
func Open(uri string) (*Conn, error) {
	c, err := lv.NewConnect(uri)
	if err != nil {
		return nil, Classify("connect "+uri, err)
	}
	return &Conn{c: c, uri: uri, PollInterval: 200 * time.Millisecond}, nil
}

// URI is the connection's URI.
func (c *Conn) URI() string { return c.uri }

// Close closes the connection.
func (c *Conn) Close() error {
	_, err := c.c.Close()
	return err
}

func stateName(s lv.DomainState) string {
	switch s {
	case lv.DOMAIN_RUNNING:
		return "running"
	case lv.DOMAIN_BLOCKED:
		return "blocked"
	case lv.DOMAIN_PAUSED:
		return "paused"
	case lv.DOMAIN_SHUTDOWN:
		return "shutdown"
	case lv.DOMAIN_SHUTOFF:
		return "shutoff"
	case lv.DOMAIN_CRASHED:
		return "crashed"
	case lv.DOMAIN_PMSUSPENDED:
		return "pmsuspended"
	}
	return "nostate"
}

func getDomain(d *lv.Domain, flags lv.DomainXMLFlags) (Domain, error) {
	x, err := d.GetXMLDesc(flags)
	if err != nil {
		return Domain{}, Classify("get domain xml", err)
	}
	dom, err := ParseDomainXML(x)
	if err != nil {
		return Domain{}, hosterr.New(hosterr.Internal, "parse domain xml", err)
	}
	return dom, nil
}

// describe reads a domain's state and hostdevs. With live set and the domain
// active, hostdevs are the union of the live and persistent definitions,
// each marked with where it is; otherwise only the persistent one.
func (c *Conn) describe(d *lv.Domain, live bool) (Domain, error) {
	st, _, err := d.GetState()
	if err != nil {
		return Domain{}, Classify("get domain state", err)
	}
	cfg, err := getDomain(d, lv.DOMAIN_XML_INACTIVE)
	if err != nil {
		return Domain{}, err
	}
	cfg.State = stateName(st)
	for i := range cfg.Hostdevs {
		cfg.Hostdevs[i].Config = true
	}
	if !live || !cfg.Running() {
		return cfg, nil
	}
	cur, err := getDomain(d, 0)
	if err != nil {
		return Domain{}, err
	}
	for _, h := range cur.Hostdevs {
		i := slices.IndexFunc(cfg.Hostdevs, func(c Hostdev) bool { return c.key() == h.key() })
		if i >= 0 {
			cfg.Hostdevs[i].Live = true
			continue
		}
		h.Live = true
		cfg.Hostdevs = append(cfg.Hostdevs, h)
	}
	return cfg, nil
}

// Domains lists all domains (active and defined), sorted by name, with the
// hostdevs of their live and persistent definitions (see Hostdev.Live/Config).
func (c *Conn) Domains(ctx context.Context) ([]Domain, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	doms, err := c.c.ListAllDomains(0)
	if err != nil {
		return nil, Classify("list domains", err)
	}
	defer func() {
		for i := range doms {
			doms[i].Free()
		}
	}()
	out := make([]Domain, 0, len(doms))
	for i := range doms {
		d, err := c.describe(&doms[i], true)
		if hosterr.Is(err, hosterr.NotFound) {
			continue // undefined while we looked
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Domain) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (c *Conn) lookup(uuid string) (*lv.Domain, error) {
	d, err := c.c.LookupDomainByUUIDString(uuid)
	if err != nil {
		return nil, Classify("lookup domain "+uuid, err)
	}
	return d, nil
}

// Domain returns one domain by UUID, with live and persistent hostdevs.
func (c *Conn) Domain(ctx context.Context, uuid string) (Domain, error) {
	if err := ctx.Err(); err != nil {
		return Domain{}, err
	}
	d, err := c.lookup(uuid)
	if err != nil {
		return Domain{}, err
	}
	defer d.Free()
	return c.describe(d, true)
}

// DomainConfig returns one domain's persistent (inactive) definition.
func (c *Conn) DomainConfig(ctx context.Context, uuid string) (Domain, error) {
	if err := ctx.Err(); err != nil {
		return Domain{}, err
	}
	d, err := c.lookup(uuid)
	if err != nil {
		return Domain{}, err
	}
	defer d.Free()
	return c.describe(d, false)
}

// DomainXML returns one domain's current XML, without the secure parts
// (no DOMAIN_XML_SECURE: graphics passwords and the like are left out),
// for a diagnostics bundle.
func (c *Conn) DomainXML(ctx context.Context, uuid string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	d, err := c.lookup(uuid)
	if err != nil {
		return "", err
	}
	defer d.Free()
	x, err := d.GetXMLDesc(0)
	if err != nil {
		return "", Classify("get domain xml", err)
	}
	return x, nil
}

// NodeDevices lists PCI and mdev node devices, sorted by name.
func (c *Conn) NodeDevices(ctx context.Context) ([]NodeDevice, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	devs, err := c.c.ListAllNodeDevices(lv.CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV | lv.CONNECT_LIST_NODE_DEVICES_CAP_MDEV)
	if err != nil {
		return nil, Classify("list node devices", err)
	}
	defer func() {
		for i := range devs {
			devs[i].Free()
		}
	}()
	var out []NodeDevice
	for i := range devs {
		x, err := devs[i].GetXMLDesc(0)
		if err != nil {
			if hosterr.Is(Classify("", err), hosterr.NotFound) {
				continue
			}
			return nil, Classify("get node device xml", err)
		}
		n, ok, err := ParseNodeDeviceXML(x)
		if err != nil {
			return nil, hosterr.New(hosterr.Internal, "parse node device xml", err)
		}
		if ok {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b NodeDevice) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// editConfig applies edit to the domain's persistent XML and defines the
// result when edit reports a change.
func (c *Conn) editConfig(ctx context.Context, op, domainUUID string, edit func(string) (string, bool, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := c.lookup(domainUUID)
	if err != nil {
		return hosterr.New(hosterr.CodeOf(err), op, err)
	}
	defer d.Free()
	x, err := d.GetXMLDesc(lv.DOMAIN_XML_INACTIVE | lv.DOMAIN_XML_SECURE)
	if err != nil {
		return Classify(op, err)
	}
	nx, changed, err := edit(x)
	if err != nil {
		return hosterr.New(hosterr.Invalid, op, err)
	}
	if !changed {
		return nil
	}
	nd, err := c.c.DomainDefineXML(nx)
	if err != nil {
		return Classify(op, err)
	}
	nd.Free()
	return nil
}

// DefineWithHostdev adds an mdev hostdev to the domain's persistent config
// (DefineXML). It takes effect at the next start; with a hostdev for that
// UUID already present it does nothing.
func (c *Conn) DefineWithHostdev(ctx context.Context, domainUUID, mdevUUID string) error {
	return c.DefineHostdevXML(ctx, domainUUID, MdevHostdevXML(mdevUUID))
}

// DefineHostdevXML is DefineWithHostdev for any mdev or PCI hostdev element.
func (c *Conn) DefineHostdevXML(ctx context.Context, domainUUID, hostdevXML string) error {
	return c.editConfig(ctx, "define hostdev in "+domainUUID, domainUUID, func(x string) (string, bool, error) {
		return AddHostdev(x, hostdevXML)
	})
}

// RemoveHostdevConfig removes an mdev hostdev from the domain's persistent
// config; absent already is not an error.
func (c *Conn) RemoveHostdevConfig(ctx context.Context, domainUUID, mdevUUID string) error {
	return c.RemoveHostdevXML(ctx, domainUUID, MdevHostdevXML(mdevUUID))
}

// RemoveHostdevXML is RemoveHostdevConfig for any mdev or PCI hostdev element.
func (c *Conn) RemoveHostdevXML(ctx context.Context, domainUUID, hostdevXML string) error {
	return c.editConfig(ctx, "remove hostdev from "+domainUUID, domainUUID, func(x string) (string, bool, error) {
		return RemoveHostdev(x, hostdevXML)
	})
}

// Shutdown asks the guest to shut down (ACPI) and waits until the domain is
// shut off, ctx ends or timeout passes (then a Timeout error; the domain is
// never destroyed here). A domain already shut off is not an error.
func (c *Conn) Shutdown(ctx context.Context, uuid string, timeout time.Duration) error {
	op := "shutdown " + uuid
	d, err := c.lookup(uuid)
	if err != nil {
		return hosterr.New(hosterr.CodeOf(err), op, err)
	}
	defer d.Free()
	active, err := d.IsActive()
	if err != nil {
		return Classify(op, err)
	}
	if !active {
		return nil
	}
	if err := d.Shutdown(); err != nil {
		if hosterr.Is(Classify(op, err), hosterr.DomainNotRunning) {
			return nil
		}
		return Classify(op, err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(c.PollInterval)
	defer tick.Stop()
	for {
		st, _, err := d.GetState()
		if err != nil {
			return Classify(op, err)
		}
		if st == lv.DOMAIN_SHUTOFF {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return hosterr.Errorf(hosterr.Timeout, op, "still %s after %s", stateName(st), timeout)
		case <-tick.C:
		}
	}
}

// Start starts a defined domain; a running domain is not an error.
func (c *Conn) Start(ctx context.Context, uuid string) error {
	op := "start " + uuid
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := c.lookup(uuid)
	if err != nil {
		return hosterr.New(hosterr.CodeOf(err), op, err)
	}
	defer d.Free()
	if active, err := d.IsActive(); err == nil && active {
		return nil
	}
	if err := d.Create(); err != nil {
		if hosterr.Is(Classify(op, err), hosterr.Exists) {
			return nil
		}
		return Classify(op, err)
	}
	return nil
}

// DefineAndStart defines a domain from its full XML and starts it, as
// Nova's libvirt driver does when it spawns an instance. Tests use it on
// a fake host's test driver to play that driver.
func (c *Conn) DefineAndStart(ctx context.Context, domainXML string) error {
	op := "define and start domain"
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := c.c.DomainDefineXML(domainXML)
	if err != nil {
		return Classify(op, err)
	}
	defer d.Free()
	if err := d.Create(); err != nil {
		return Classify(op, err)
	}
	return nil
}

// DestroyAndUndefine stops a domain at once and removes its definition, as
// Nova's libvirt driver does when it deletes an instance; an unknown
// domain is not an error.
func (c *Conn) DestroyAndUndefine(ctx context.Context, uuid string) error {
	op := "destroy and undefine " + uuid
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := c.lookup(uuid)
	if err != nil {
		if hosterr.Is(err, hosterr.NotFound) {
			return nil
		}
		return hosterr.New(hosterr.CodeOf(err), op, err)
	}
	defer d.Free()
	if active, err := d.IsActive(); err == nil && active {
		if err := d.Destroy(); err != nil {
			return Classify(op, err)
		}
	}
	return Classify(op, d.Undefine())
}

// Tunables are a VM's resource limits, applied through libvirt where the
// hypervisor supports them. On cgroup v2, libvirt writes global_period /
// global_quota to the VM's cpu.max and the memory soft limit to memory.high.
type Tunables struct {
	CPUPeriodUs   uint64 // cpu.max period; 0 keeps the current value
	CPUQuotaUs    int64  // cpu.max quota; 0 keeps, -1 removes the limit
	MemoryHighKiB uint64 // memory soft limit (memory.high); 0 keeps
}

// SetTunables applies t to the running domain (live) and to its config.
// When libvirt refuses (unsupported by the driver, domain not running) the
// error carries that code and the caller falls back to agent/cgroup.
func (c *Conn) SetTunables(ctx context.Context, uuid string, t Tunables) error {
	op := "set tunables of " + uuid
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := c.lookup(uuid)
	if err != nil {
		return hosterr.New(hosterr.CodeOf(err), op, err)
	}
	defer d.Free()
	flags := lv.DOMAIN_AFFECT_CONFIG
	if active, _ := d.IsActive(); active {
		flags |= lv.DOMAIN_AFFECT_LIVE
	}
	if t.CPUPeriodUs != 0 || t.CPUQuotaUs != 0 {
		p := &lv.DomainSchedulerParameters{}
		if t.CPUPeriodUs != 0 {
			p.GlobalPeriodSet, p.GlobalPeriod = true, t.CPUPeriodUs
		}
		if t.CPUQuotaUs != 0 {
			p.GlobalQuotaSet, p.GlobalQuota = true, t.CPUQuotaUs
		}
		if err := d.SetSchedulerParametersFlags(p, flags); err != nil {
			return Classify(op+": cpu", err)
		}
	}
	if t.MemoryHighKiB != 0 {
		p := &lv.DomainMemoryParameters{SoftLimitSet: true, SoftLimit: t.MemoryHighKiB}
		if err := d.SetMemoryParameters(p, flags); err != nil {
			return Classify(op+": memory", err)
		}
	}
	return nil
}

// raw gives the hot-plugger in this package the underlying connection.
func (c *Conn) raw() *lv.Connect { return c.c }

// String is for logs.
func (c *Conn) String() string { return fmt.Sprintf("libvirt(%s)", c.uri) }

// Hypervisor names the hypervisor of the connection as NVIDIA's
// compatibility matrix does: "KVM (QEMU 8.2.2)" for libvirt's QEMU
// driver, else libvirt's own name and version ("TEST (2.0.0)").
func (c *Conn) Hypervisor(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	typ, err := c.c.GetType()
	if err != nil {
		return "", fmt.Errorf("libvirt: hypervisor type: %w", err)
	}
	v, err := c.c.GetVersion()
	if err != nil {
		return "", fmt.Errorf("libvirt: hypervisor version: %w", err)
	}
	ver := fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
	if strings.EqualFold(typ, "QEMU") {
		return "KVM (QEMU " + ver + ")", nil
	}
	return typ + " (" + ver + ")", nil
}
