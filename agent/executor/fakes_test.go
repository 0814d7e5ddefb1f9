package executor

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	agpu "github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

// fakeHost is a hand-written host: sysfs mdevs and VFs, libvirt domains,
// GPUs and a limiter, recording every change it is asked to make.
type fakeHost struct {
	mu        sync.Mutex
	mdevs     map[string]sysfs.Mdev
	available map[string]int    // parent/type → instances left
	names     map[string]string // parent/type → type name ("GRID A100-1-5C")
	vfs       map[pci.Addr]*sysfs.VF
	doms      map[string]*Domain
	ops       []string
	errs      map[string]error // op name → error to return
}

func newFakeHost() *fakeHost {
	return &fakeHost{mdevs: map[string]sysfs.Mdev{}, available: map[string]int{}, names: map[string]string{}, vfs: map[pci.Addr]*sysfs.VF{},
		doms: map[string]*Domain{}, errs: map[string]error{}}
}

func (f *fakeHost) record(op string, args ...any) error {
	f.ops = append(f.ops, strings.TrimSpace(op+" "+fmt.Sprint(args...)))
	return f.errs[op]
}

func (f *fakeHost) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, o := range f.ops {
		if strings.HasPrefix(o, prefix) {
			n++
		}
	}
	return n
}

func (f *fakeHost) opList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ops...)
}

func (f *fakeHost) CreateMdev(_ context.Context, parent pci.Addr, typeID, uuid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("create_mdev", uuid); err != nil {
		return err
	}
	if _, ok := f.mdevs[uuid]; ok {
		return hosterr.Errorf(hosterr.Exists, "create", "exists")
	}
	k := parent.String() + "/" + typeID
	if f.available[k] <= 0 {
		return hosterr.Errorf(hosterr.NoCapacity, "create", "available_instances is 0")
	}
	f.available[k]--
	f.mdevs[uuid] = sysfs.Mdev{UUID: uuid, Parent: parent, Type: typeID}
	return nil
}

func (f *fakeHost) RemoveMdev(_ context.Context, uuid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("remove_mdev", uuid); err != nil {
		return err
	}
	m, ok := f.mdevs[uuid]
	if !ok {
		return hosterr.Errorf(hosterr.NotFound, "remove", "no mdev")
	}
	// The kernel (6.1) does not refuse: the write waits until QEMU lets the
	// device go, which a guest never does by itself. A fake cannot hang the
	// test; it fails with what the agent would never see.
	for _, d := range f.doms {
		if h, ok := d.Has(Hostdev{MdevUUID: uuid}); ok && h.Live && d.Running {
			return fmt.Errorf("fake kernel: removing mdev %s held by running domain %s would block the agent until QEMU lets it go", uuid, d.UUID)
		}
	}
	delete(f.mdevs, uuid)
	f.available[m.Parent.String()+"/"+m.Type]++
	return nil
}

func (f *fakeHost) Mdevs(context.Context) ([]sysfs.Mdev, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sysfs.Mdev
	for _, m := range f.mdevs {
		out = append(out, m)
	}
	return out, nil
}

func (f *fakeHost) Types(_ context.Context, parent pci.Addr) ([]sysfs.MdevType, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sysfs.MdevType
	for k, n := range f.available {
		p, typ, _ := strings.Cut(k, "/")
		if p == parent.String() {
			out = append(out, sysfs.MdevType{ID: typ, Name: f.names[k], AvailableInstances: n})
		}
	}
	return out, nil
}

func (f *fakeHost) VFs(context.Context) ([]sysfs.VF, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sysfs.VF
	for _, v := range f.vfs {
		out = append(out, *v)
	}
	return out, nil
}

func (f *fakeHost) SetVFType(_ context.Context, vf pci.Addr, typeID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("set_vf_type", vf, " ", typeID); err != nil {
		return err
	}
	v, ok := f.vfs[vf]
	if !ok {
		return hosterr.Errorf(hosterr.NotFound, "set vf", "no vf")
	}
	if typeID == "0" {
		v.Current = ""
	} else {
		v.Current = typeID
	}
	return nil
}

func (f *fakeHost) SetVGPUParams(_ context.Context, mdevUUID string, vf pci.Addr, params string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	dev := mdevUUID
	if dev == "" {
		dev = vf.String()
	}
	return f.record("set_vgpu_params", dev, " ", params)
}

func (f *fakeHost) Domain(_ context.Context, uuid string) (Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.doms[uuid]
	if !ok {
		return Domain{}, hosterr.Errorf(hosterr.NotFound, "domain", "no domain %s", uuid)
	}
	c := *d
	c.Hostdevs = append([]Hostdev(nil), d.Hostdevs...)
	return c, nil
}

func (f *fakeHost) List(context.Context) ([]Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Domain
	for _, d := range f.doms {
		c := *d
		c.Hostdevs = append([]Hostdev(nil), d.Hostdevs...)
		out = append(out, c)
	}
	return out, nil
}

func (f *fakeHost) dom(uuid string) (*Domain, error) {
	d, ok := f.doms[uuid]
	if !ok {
		return nil, hosterr.Errorf(hosterr.NotFound, "domain", "no domain %s", uuid)
	}
	return d, nil
}

func (f *fakeHost) set(d *Domain, h Hostdev, live, config bool) {
	for i, x := range d.Hostdevs {
		if x.same(h) {
			d.Hostdevs[i].Live = d.Hostdevs[i].Live || live
			d.Hostdevs[i].Config = d.Hostdevs[i].Config || config
			return
		}
	}
	h.Live, h.Config = live, config
	d.Hostdevs = append(d.Hostdevs, h)
}

func (f *fakeHost) unset(d *Domain, h Hostdev, live, config bool) {
	out := d.Hostdevs[:0]
	for _, x := range d.Hostdevs {
		if x.same(h) {
			x.Live = x.Live && !live
			x.Config = x.Config && !config
			if !x.Live && !x.Config {
				continue
			}
		}
		out = append(out, x)
	}
	d.Hostdevs = out
}

func (f *fakeHost) DefineHostdev(_ context.Context, uuid string, h Hostdev) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("define", h); err != nil {
		return err
	}
	d, err := f.dom(uuid)
	if err != nil {
		return err
	}
	f.set(d, h, false, true)
	return nil
}

func (f *fakeHost) RemoveHostdevConfig(_ context.Context, uuid string, h Hostdev) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("undefine", h); err != nil {
		return err
	}
	d, err := f.dom(uuid)
	if err != nil {
		return err
	}
	f.unset(d, h, false, true)
	return nil
}

func (f *fakeHost) AttachLive(_ context.Context, uuid string, h Hostdev) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("attach_live", h); err != nil {
		return err
	}
	d, err := f.dom(uuid)
	if err != nil {
		return err
	}
	if !d.Running {
		return hosterr.Errorf(hosterr.DomainNotRunning, "attach", "not running")
	}
	if x, ok := d.Has(h); ok && x.Live {
		return hosterr.Errorf(hosterr.Exists, "attach", "attached twice")
	}
	f.set(d, h, true, true)
	return nil
}

func (f *fakeHost) DetachLive(_ context.Context, uuid string, h Hostdev) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("detach_live", h); err != nil {
		return err
	}
	d, err := f.dom(uuid)
	if err != nil {
		return err
	}
	if x, ok := d.Has(h); !ok || !x.Live {
		return hosterr.Errorf(hosterr.NotFound, "detach", "device not found")
	}
	f.unset(d, h, true, true)
	return nil
}

func (f *fakeHost) Shutdown(_ context.Context, uuid string, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("shutdown", uuid); err != nil {
		return err
	}
	d, err := f.dom(uuid)
	if err != nil {
		return err
	}
	d.Running = false
	out := d.Hostdevs[:0]
	for _, h := range d.Hostdevs {
		h.Live = false
		if h.Config {
			out = append(out, h)
		}
	}
	d.Hostdevs = out
	return nil
}

func (f *fakeHost) Start(_ context.Context, uuid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("start", uuid); err != nil {
		return err
	}
	d, err := f.dom(uuid)
	if err != nil {
		return err
	}
	d.Running = true
	for i := range d.Hostdevs {
		d.Hostdevs[i].Live = d.Hostdevs[i].Config
	}
	return nil
}

func (f *fakeHost) SetVGPUScheduler(_ context.Context, gpu pci.Addr, policy string, ts uint32) (agpu.Applied, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return agpu.Applied{Changed: true, Scheduler: &agpu.Scheduler{Policy: policy, TimesliceUs: ts}}, f.record("scheduler", gpu, " ", policy, " ", ts)
}

func (f *fakeHost) SetApplicationClocks(_ context.Context, gpu pci.Addr, mem, sm uint32) (agpu.Applied, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return agpu.Applied{Changed: true, AppMemMHz: mem, AppSMMHz: sm}, f.record("clocks", gpu, " ", mem, " ", sm)
}

func (f *fakeHost) ResetApplicationClocks(_ context.Context, gpu pci.Addr) (agpu.Applied, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return agpu.Applied{Changed: true}, f.record("reset_clocks", gpu)
}

func (f *fakeHost) SetVMLimits(_ context.Context, uuid string, l protocol.LimitParams) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "libvirt", f.record("limits", uuid, " ", l.CPUMax, " ", l.MemoryHigh)
}

var (
	_ Sysfs   = (*fakeHost)(nil)
	_ Domains = (*fakeHost)(nil)
	_ GPUs    = (*fakeHost)(nil)
	_ Limiter = (*fakeHost)(nil)
)
