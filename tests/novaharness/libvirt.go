package novaharness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
)

// FakeHost is the simulated host of one compute host: agent/fakehost's
// default hardware (two Tesla T4 with mdev types nvidia-222…234 at
// 0000:3b:00.0 and 0000:d8:00.0, one H200-like VFIO PF) without mdevs or
// domains. The harness holds its drivers open for the whole run: the
// libvirt test driver keeps its domains in that one connection, which
// the harness (playing Nova's libvirt driver) and the agent (StartAgent)
// share.
type FakeHost struct {
	Name    string // compute host = agent host = Nova node = Placement root provider name
	Dir     string
	Drivers *agent.Drivers

	mu    sync.Mutex
	mdevs map[string][]string // instance uuid → mdevs the "libvirt driver" made for it
	// Events is what the FakeDriver reported, in order ("spawn <uuid>", …).
	events []string
}

func newFakeHost(dir, name string) (*FakeHost, error) {
	spec := fakehost.DefaultSpec()
	spec.Host = name
	for i := range spec.MdevGPUs {
		spec.MdevGPUs[i].Mdevs = nil
	}
	for i := range spec.VFIOGPUs {
		spec.VFIOGPUs[i].Current = nil
	}
	spec.Domains = nil
	if _, err := fakehost.Build(dir, spec); err != nil {
		return nil, err
	}
	drv, err := agent.OpenFakeHost(dir)
	if err != nil {
		return nil, err
	}
	return &FakeHost{Name: name, Dir: dir, Drivers: drv, mdevs: map[string][]string{}}, nil
}

func (h *FakeHost) close() { h.Drivers.Close() }

func (h *FakeHost) hasType(addr, typeID string) bool {
	for _, g := range h.Drivers.Fake.Spec.MdevGPUs {
		if g.Addr.String() == addr {
			return slices.ContainsFunc(g.Types, func(t fakehost.Type) bool { return t.ID == typeID })
		}
	}
	return false
}

// FakeHost returns the simulated host of a compute host (nil for an
// unknown host).
func (n *Nova) FakeHost(host string) *FakeHost {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fake[host]
}

// Mdevs returns the host's mdevs by uuid.
func (h *FakeHost) Mdevs(t testing.TB) map[string]MdevInfo {
	t.Helper()
	ms, err := h.Drivers.Sysfs.Mdevs(context.Background())
	if err != nil {
		t.Fatalf("mdevs of %s: %v", h.Name, err)
	}
	out := map[string]MdevInfo{}
	for _, m := range ms {
		out[m.UUID] = MdevInfo{Parent: m.Parent.String(), Type: m.Type}
	}
	return out
}

// MdevInfo is one mdev of a fake host.
type MdevInfo struct{ Parent, Type string }

// Domain returns the libvirt domain of an instance on the host; ok is
// false when the host has none.
func (h *FakeHost) Domain(t testing.TB, instance string) (d libvirt.Domain, ok bool) {
	t.Helper()
	d, err := h.Drivers.Libvirt.Domain(context.Background(), instance)
	if hosterr.Is(err, hosterr.NotFound) {
		return d, false
	}
	if err != nil {
		t.Fatalf("domain %s on %s: %v", instance, h.Name, err)
	}
	return d, true
}

// NovaMdevs are the mdevs the harness made (as Nova's libvirt driver) for
// an instance on this host.
func (h *FakeHost) NovaMdevs(instance string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.mdevs[instance])
}

// Events are the FakeDriver calls this host saw ("spawn <uuid>", "destroy
// <uuid>", …), oldest first.
func (h *FakeHost) Events() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// StartAgent runs vgpu-agent in this process on the host's fake host
// until the test ends. Its configuration is host and node = host,
// transport_url = n.TransportURL(), a fresh state_path and short report
// intervals; extra are more section.option=value overrides, which win.
func (n *Nova) StartAgent(t testing.TB, host string, extra ...string) {
	t.Helper()
	fh := n.FakeHost(host)
	if fh == nil {
		t.Fatalf("StartAgent: %s is not a compute host of this Nova (%v)", host, n.Hosts())
	}
	v, err := agent.LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.host=" + host, "DEFAULT.node=" + host,
		"DEFAULT.transport_url=" + n.transport, "DEFAULT.state_path=" + t.TempDir(), "DEFAULT.listen=127.0.0.1:0",
		"DEFAULT.report_check_interval=1s", "DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"},
		append(testkeys.For(t).Agent(host), extra...)...)})
	if err != nil {
		t.Fatalf("agent config: %v", err)
	}
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(&testWriter{t: t, prefix: "agent " + host + ": "}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.RunWith(ctx, v, log, agent.RunOptions{FakeHostDir: fh.Dir, Drivers: fh.Drivers})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent on %s: %v", host, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("agent on %s did not stop within 20s", host)
		}
	})
}

type testWriter struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer func() { _ = recover() }() // a log line after the test ended
	w.t.Log(w.prefix + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// hookServer receives the FakeDriver's calls (launcher.py).
type hookServer struct {
	n   *Nova
	srv *http.Server
	url string
}

// hookCall is one FakeDriver call.
type hookCall struct {
	// Event: spawn, spawn_stopped, destroy, power_off, power_on, revert,
	// live_migration (source, before the move), live_migration_dest
	// (destination, guest running there), live_migration_source (source,
	// after the move).
	Event        string `json:"event"`
	Host         string `json:"host"`
	Dest         string `json:"dest,omitempty"` // live_migration: the destination host
	InstanceUUID string `json:"instance_uuid"`
	InstanceName string `json:"instance_name"`
	// Allocations are what Nova passed to spawn: provider → {"resources": {class: n}}.
	Allocations map[string]struct {
		Resources map[string]int `json:"resources"`
	} `json:"allocations"`
	// VGPUFirst is the one VGPU allocation of Allocations that Nova 26's
	// libvirt driver serves (the first in Placement's order: launcher.py
	// _vgpu_first); nil without VGPU.
	VGPUFirst *struct {
		Provider string `json:"provider"`
		Count    int    `json:"count"`
	} `json:"vgpu_first"`
}

func newHookServer(n *Nova) (*hookServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hookServer{n: n, url: "http://" + ln.Addr().String() + "/driver"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /driver", h.serve)
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go h.srv.Serve(ln)
	return h, nil
}

func (h *hookServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
}

func (h *hookServer) serve(w http.ResponseWriter, r *http.Request) {
	var c hookCall
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err := json.Unmarshal(b, &c); err != nil {
		http.Error(w, "bad hook call: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 50*time.Second)
	defer cancel()
	if c.Event == "list" {
		h.n.listDomains(ctx, w, c.Host)
		return
	}
	if err := h.n.driverCall(ctx, c); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, errUnavailable) {
			code = http.StatusConflict // launcher.py raises ComputeResourcesUnavailable
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// HoldSpawn makes the instance's next spawn (a boot, or the end of a
// resize: Nova's finish_migration) wait in the driver until release is
// called, so that Nova is still working (RESIZE, task state
// resize_finish) for as long as a test needs. The hook answers within
// 50 s whatever happens: release before then.
func (n *Nova) HoldSpawn(t testing.TB, instance string) (release func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.holds == nil {
		n.holds = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	n.holds[instance] = ch
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return release
}

// held waits while a HoldSpawn holds the instance's spawn.
func (n *Nova) held(ctx context.Context, c hookCall) error {
	if c.Event != "spawn" && c.Event != "spawn_stopped" {
		return nil
	}
	n.mu.Lock()
	ch := n.holds[c.InstanceUUID]
	delete(n.holds, c.InstanceUUID)
	n.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("spawn of %s held by the test past the hook's deadline: %w", c.InstanceUUID, ctx.Err())
	}
}

// FailLiveMigration makes the instance's next live migration fail in
// the driver on its source host, before anything moved, as a libvirt
// migration error would: Nova rolls it back (the instance stays ACTIVE on
// its source, the migration is failed, the allocations return to the
// instance). reason is the driver's error.
func (n *Nova) FailLiveMigration(t testing.TB, instance, reason string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.failLive == nil {
		n.failLive = map[string]string{}
	}
	n.failLive[instance] = reason
	t.Cleanup(func() {
		n.mu.Lock()
		delete(n.failLive, instance)
		n.mu.Unlock()
	})
}

// liveFailure consumes the instance's FailLiveMigration, if any.
func (n *Nova) liveFailure(c hookCall) error {
	if c.Event != "live_migration" {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	reason, ok := n.failLive[c.InstanceUUID]
	if !ok {
		return nil
	}
	delete(n.failLive, c.InstanceUUID)
	return fmt.Errorf("live migration of %s to %s failed (injected by the test): %s", c.InstanceUUID, c.Dest, reason)
}

// driverCall plays Nova's libvirt driver for one FakeDriver call.
func (n *Nova) driverCall(ctx context.Context, c hookCall) error {
	if err := n.held(ctx, c); err != nil {
		return err
	}
	err := n.liveFailure(c)
	if err == nil {
		err = n.mdevMigrationRefused(ctx, c)
	}
	if err != nil {
		fh := n.FakeHost(c.Host)
		if fh != nil {
			fh.mu.Lock()
			fh.events = append(fh.events, "live_migration_failed "+c.InstanceUUID)
			fh.mu.Unlock()
		}
		return err
	}
	fh := n.FakeHost(c.Host)
	if fh == nil {
		return fmt.Errorf("no fake host %q", c.Host)
	}
	fh.mu.Lock()
	defer fh.mu.Unlock()
	fh.events = append(fh.events, c.Event+" "+c.InstanceUUID)
	conn := fh.Drivers.Libvirt
	switch c.Event {
	case "live_migration":
		return nil // the source's guest keeps running until live_migration_source
	case "live_migration_source":
		return fh.undefine(ctx, c.InstanceUUID)
	case "reboot_hard", "reboot_soft":
		return fh.reboot(ctx, c.InstanceUUID)
	case "revert":
		return fh.revert(ctx, c)
	case "spawn", "spawn_stopped", "live_migration_dest":
		vgpus := map[string]int{}
		for rp, a := range c.Allocations {
			if a.Resources["VGPU"] > 0 {
				vgpus[rp] = a.Resources["VGPU"]
			}
		}
		if c.VGPUFirst != nil { // a spawn: the driver serves the first VGPU allocation only
			first, err := n.firstVGPU(c)
			if err != nil {
				return err
			}
			vgpus = first
		}
		if c.Event == "live_migration_dest" { // the driver gets no allocations: read them
			al, err := n.allocations(ctx, c.InstanceUUID)
			if err != nil {
				return err
			}
			for rp, res := range al {
				if res["VGPU"] > 0 {
					vgpus[rp] = res["VGPU"]
				}
			}
		}
		if err := fh.undefine(ctx, c.InstanceUUID); err != nil {
			return err
		}
		var made []string
		for rp, count := range vgpus {
			n.mu.Lock()
			child, ok := n.children[rp]
			n.mu.Unlock()
			if !ok || child.host != c.Host {
				return fmt.Errorf("VGPU allocation of %s on provider %s, which is not a GPU AddVGPUChild made on %s", c.InstanceUUID, rp, c.Host)
			}
			parent, err := pci.Parse(child.pci)
			if err != nil {
				return err
			}
			free, err := fh.unassignedMdevs(ctx, child.pci, child.typeID)
			if err != nil {
				return err
			}
			for range count {
				id := uuid.NewString()
				if len(free) > 0 { // _allocate_mdevs: an unassigned mdev first
					id, free = free[len(free)-1], free[:len(free)-1]
				} else if err := fh.Drivers.Sysfs.CreateMdev(ctx, parent, child.typeID, id); err != nil {
					return fmt.Errorf("create mdev for %s: %w", c.InstanceUUID, err)
				}
				made = append(made, id)
				fh.mdevs[c.InstanceUUID] = append(fh.mdevs[c.InstanceUUID], id)
			}
		}
		vfs, err := n.passthrough(ctx, c.Host, c.InstanceUUID)
		if err != nil {
			return err
		}
		if err := conn.DefineAndStart(ctx, domainXML(c.InstanceName, c.InstanceUUID, made, vfs...)); err != nil {
			return fmt.Errorf("domain of %s: %w", c.InstanceUUID, err)
		}
		if c.Event == "spawn_stopped" {
			return conn.Shutdown(ctx, c.InstanceUUID, 10*time.Second)
		}
		return nil
	case "destroy":
		return fh.undefine(ctx, c.InstanceUUID)
	case "power_off":
		err := conn.Shutdown(ctx, c.InstanceUUID, 10*time.Second)
		if hosterr.Is(err, hosterr.NotFound) {
			return nil
		}
		return err
	case "power_on":
		return conn.Start(ctx, c.InstanceUUID)
	}
	return fmt.Errorf("unknown driver event %q", c.Event)
}

// undefine removes an instance's domain and the mdevs the harness made
// for it (fh.mu held). Mdevs others made (the agent) stay.
func (h *FakeHost) undefine(ctx context.Context, instance string) error {
	if err := h.Drivers.Libvirt.DestroyAndUndefine(ctx, instance); err != nil {
		return err
	}
	var errs []error
	for _, m := range h.mdevs[instance] {
		if err := h.Drivers.Sysfs.RemoveMdev(ctx, m); err != nil && !hosterr.Is(err, hosterr.NotFound) {
			errs = append(errs, err)
		}
	}
	delete(h.mdevs, instance)
	return errors.Join(errs...)
}

// domainXML is the test-driver domain of an instance with mdev hostdevs.
func domainXML(name, id string, mdevs []string, vfs ...pci.Addr) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<domain type='test'>\n  <name>%s</name>\n  <uuid>%s</uuid>\n", html.EscapeString(name), html.EscapeString(id))
	b.WriteString("  <memory unit='KiB'>2097152</memory>\n  <vcpu>2</vcpu>\n  <os><type arch='x86_64'>hvm</type></os>\n  <devices>\n")
	for _, m := range mdevs {
		b.WriteString("    " + libvirt.MdevHostdevXML(m) + "\n")
	}
	for _, a := range vfs {
		b.WriteString("    " + libvirt.PCIHostdevXML(a) + "\n")
	}
	b.WriteString("  </devices>\n</domain>\n")
	return b.String()
}
