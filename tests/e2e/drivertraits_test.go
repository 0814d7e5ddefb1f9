package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestGuestDriverTraitsKeepNovaOff: with [placement] add_driver_traits the
// bridge writes on the GPU provider the guest driver branches its host's
// vGPU manager serves (the fake host's agent reports 550.54.16; the
// shipped matrix serves the same branch and, from 525 on, the previous
// one: 535 and 550). Nova's own scheduler then keeps a guest off a host
// that cannot serve its driver: a server whose flavor requires the 570
// branch ends in ERROR with NoValidHost; one requiring 535 lands on the
// host with its vGPU. The bridge's audit log records the change.
//
// The same traits go on the host's compute node (root) provider: an
// image's trait:...=required lands in Nova's unnumbered request group,
// while a flavor of vgpuctl flavor plan asks for the vGPU in group 1, so
// only the root can meet it. A server from an image requiring 570 with a
// group-1 vGPU flavor ends NoValidHost; one from an image requiring 550
// lands.
func TestGuestDriverTraitsKeepNovaOff(t *testing.T) {
	n := sharedNova(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	host, gpu := addDirectHost(t, n, "drv")
	d, _ := startNovaBridge(t, n, "placement.add_driver_traits=true", "placement.sync_interval=1s")

	want := []string{placement.GuestDriverTrait(535), placement.GuestDriverTrait(550)}
	root := n.ComputeNodeProvider(t, host)
	var rootTraits []string
	for _, rp := range []string{gpu, root} {
		var got []string
		waitFor(t, 2*time.Minute, "the guest driver traits on "+rp, func() bool {
			var out struct {
				Traits []string `json:"traits"`
			}
			testsvc.Must(t, n.PlacementCall(ctx, http.MethodGet, "/resource_providers/"+rp+"/traits", nil, &out), "provider traits")
			got = got[:0]
			for _, tr := range out.Traits {
				if strings.HasPrefix(tr, placement.GuestDriverTraitPrefix) {
					got = append(got, tr)
				}
			}
			slices.Sort(got)
			rootTraits = out.Traits
			return slices.Equal(got, want)
		})
		var audited int
		testsvc.Must(t, d.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action = 'placement.driver_traits' AND object_id = $1`, rp).
			Scan(&audited), "audit")
		if audited != 1 {
			t.Errorf("%d audit records of the traits of %s, want 1", audited, rp)
		}
	}
	// Nova's own traits of the compute node stay.
	if !slices.Contains(rootTraits, "COMPUTE_NODE") {
		t.Errorf("compute node %s traits %v: COMPUTE_NODE gone", root, rootTraits)
	}

	prefix := testsvc.Name("drv")
	flavor := func(branch int) string {
		return n.CreateFlavor(t, prefix+".t4-4q.r"+strings.TrimPrefix(placement.GuestDriverTrait(branch), placement.GuestDriverTraitPrefix),
			2, 2048, 10, map[string]string{"resources:VGPU": "1", "trait:" + directTrait: "required",
				"trait:" + placement.GuestDriverTrait(branch): "required"})
	}
	tooNew := n.CreateServer(t, prefix+"-r570", flavor(570), host)
	if s := n.WaitServer(t, tooNew, "ERROR"); !strings.Contains(s.Fault, "No valid host") {
		t.Errorf("server requiring guest driver 570: %s, fault %q; want ERROR with NoValidHost", s.Status, s.Fault)
	}
	served := n.CreateServer(t, prefix+"-r535", flavor(535), host)
	if s := n.WaitServer(t, served, "ACTIVE"); s.Host != host {
		t.Errorf("server requiring guest driver 535 on %q, want %s", s.Host, host)
	}
	if al := n.Allocations(t, served); al[gpu]["VGPU"] != 1 {
		t.Errorf("allocations of the 535 server: %v, want VGPU 1 on %s", al, gpu)
	}
	n.DeleteServer(t, tooNew)
	n.DeleteServer(t, served)

	// An image's trait: a flavor asking for the vGPU in group 1, as
	// vgpuctl flavor plan makes them; the image's property is met by the
	// compute node.
	grouped := n.CreateFlavor(t, prefix+".t4-4q.g1", 2, 2048, 10,
		map[string]string{"resources1:VGPU": "1", "trait1:" + directTrait: "required"})
	imgTooNew := n.CreateServerFrom(t, prefix+"-img-r570", grouped, imageGuestDriverR570, host)
	if s := n.WaitServer(t, imgTooNew, "ERROR"); !strings.Contains(s.Fault, "No valid host") {
		t.Errorf("server from an image requiring guest driver 570: %s, fault %q; want ERROR with NoValidHost", s.Status, s.Fault)
	}
	imgServed := n.CreateServerFrom(t, prefix+"-img-r550", grouped, imageGuestDriverR550, host)
	if s := n.WaitServer(t, imgServed, "ACTIVE"); s.Host != host {
		t.Errorf("server from an image requiring guest driver 550 on %q, want %s", s.Host, host)
	}
	if al := n.Allocations(t, imgServed); al[gpu]["VGPU"] != 1 {
		t.Errorf("allocations of the 550 image's server: %v, want VGPU 1 on %s", al, gpu)
	}
	n.DeleteServer(t, imgTooNew)
	n.DeleteServer(t, imgServed)
}
