package novaharness_test

import (
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
)

// TestBootAndDeleteVGPUServer is the harness's own proof: a real Nova
// boots a server whose flavor asks for a vGPU onto the GPU child
// provider, the harness (as Nova's libvirt driver) creates the mdev and
// the domain on the fake host, and deleting the server removes both and
// the allocations.
func TestBootAndDeleteVGPUServer(t *testing.T) {
	n := novaharness.Start(t, novaharness.Options{Hosts: []string{"nt-compute"}})
	t.Logf("Nova started in %s (%s)", n.StartupTime(), n.StartupPhases())
	host := n.Hosts()[0]
	root := n.ComputeNodeProvider(t, host)
	gpu := n.AddVGPUChild(t, host, "0000:3b:00.0", "CUSTOM_NVIDIA_232", 4)
	flavor := n.CreateFlavor(t, "vgpu-t4-4q", 2, 2048, 10, map[string]string{
		"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"})
	plain := n.CreateFlavor(t, "plain", 1, 512, 1, nil)

	id := n.CreateServer(t, "vm-vgpu", flavor, host)
	s := n.WaitServer(t, id, "ACTIVE")
	if s.Host != host {
		t.Errorf("server on %q, want %q", s.Host, host)
	}
	al := n.Allocations(t, id)
	if got := al[gpu]["VGPU"]; got != 1 {
		t.Errorf("VGPU on the GPU provider = %d, want 1 (allocations %v)", got, al)
	}
	if got := al[root]["VCPU"]; got != 2 {
		t.Errorf("VCPU on the compute node = %d, want 2 (allocations %v)", got, al)
	}
	var total int64
	for name, b := range n.RSS() {
		t.Logf("RSS %s: %d MiB", name, b>>20)
		total += b
	}
	t.Logf("RSS of Nova's services: %d MiB", total>>20)
	fh := n.FakeHost(host)
	dom, ok := fh.Domain(t, id)
	if !ok {
		t.Fatalf("no domain for %s on the fake host", id)
	}
	if dom.Name != s.InstanceName || dom.State != "running" {
		t.Errorf("domain %s %s, want %s running", dom.Name, dom.State, s.InstanceName)
	}
	mdevs := dom.Mdevs()
	if len(mdevs) != 1 {
		t.Fatalf("domain mdevs %v, want 1", mdevs)
	}
	if m := fh.Mdevs(t)[mdevs[0]]; m.Type != "nvidia-232" || m.Parent != "0000:3b:00.0" {
		t.Errorf("mdev %s is %+v, want nvidia-232 on 0000:3b:00.0", mdevs[0], m)
	}

	// A server without vGPU gets a domain without hostdevs.
	other := n.CreateServer(t, "vm-plain", plain, "")
	n.WaitServer(t, other, "ACTIVE")
	if d, ok := fh.Domain(t, other); !ok || len(d.Hostdevs) != 0 {
		t.Errorf("plain server's domain %+v (found %v), want one without hostdevs", d, ok)
	}

	n.DeleteServer(t, id)
	if _, ok := fh.Domain(t, id); ok {
		t.Errorf("domain of the deleted server is still defined")
	}
	if len(fh.Mdevs(t)) != 0 {
		t.Errorf("mdevs left after delete: %v", fh.Mdevs(t))
	}
	if al := n.Allocations(t, id); len(al) != 0 {
		t.Errorf("allocations left after delete: %v", al)
	}
	n.DeleteServer(t, other)
}
