// SPDX-License-Identifier: Apache-2.0

package placement_test

import (
	"errors"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/tests/placementfleet"
)

// TestTransferReservation: a vGPU reserved under a consumer of the
// bridge's own moves into the instance's consumer with one POST
// /allocations; the reservation is gone, the GPU's usage counts the unit
// once, and a second transfer (a retry after a crash) moves nothing. A
// reservation whose instance has no allocations stays, for the caller to
// release.
func TestTransferReservation(t *testing.T) {
	s := newService(t, true)
	ty := placementfleet.UniqueType()
	f := load(t, s, []placementfleet.Node{{Name: name("it-reserve"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 4}}}})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	inst, resv := consumer(t), consumer(t)
	sc := s.Client().ServiceClient()
	if err := allocations.Update(ctx, sc, inst, allocations.UpdateOpts{
		Allocations: map[string]allocations.ProviderAllocationsOpts{f.Roots[0]: {Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}}},
		ProjectID:   f.Project, UserID: f.User, ConsumerType: "INSTANCE",
	}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	cl, err := s.Claim(ctx, placement.ClaimRequest{Consumer: resv, ProjectID: f.Project, UserID: f.User,
		ConsumerType: placement.ReservationConsumerType, Request: engine.Request{Required: []string{ty}}})
	if err != nil {
		t.Fatal(err)
	}
	if con, _ := s.Client().Allocations(ctx, resv); con.Type != placement.ReservationConsumerType || con.Providers[cl.Provider]["VGPU"] != 1 {
		t.Fatalf("reservation consumer %+v", con)
	}
	moved, err := s.TransferReservation(ctx, resv, inst)
	if err != nil {
		t.Fatal(err)
	}
	if moved[cl.Provider]["VGPU"] != 1 || len(moved) != 1 {
		t.Errorf("moved %v, want 1 VGPU on %s", moved, cl.Provider)
	}
	con, err := s.Client().Allocations(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if con.Providers[f.Roots[0]]["VCPU"] != 2 || con.Providers[cl.Provider]["VGPU"] != 1 || con.Type != "INSTANCE" {
		t.Errorf("instance consumer after the transfer: %+v", con)
	}
	if r, _ := s.Client().Allocations(ctx, resv); len(r.Providers) != 0 {
		t.Errorf("reservation consumer after the transfer: %+v", r)
	}
	if u, _, err := s.Client().Usages(ctx, cl.Provider); err != nil || u["VGPU"] != 1 {
		t.Errorf("GPU usage after the transfer %v (%v), want 1", u, err)
	}
	if g, _ := s.Index().Lookup(cl.Provider); g.Free() != 3 {
		t.Errorf("index free after the transfer = %d, want 3", g.Free())
	}
	if again, err := s.TransferReservation(ctx, resv, inst); err != nil || len(again) != 0 {
		t.Errorf("second transfer moved %v (%v), want nothing", again, err)
	}

	// The instance is gone: the reservation stays until released.
	resv2, gone := consumer(t), consumer(t)
	if _, err := s.Claim(ctx, placement.ClaimRequest{Consumer: resv2, ProjectID: f.Project, UserID: f.User,
		ConsumerType: placement.ReservationConsumerType, Request: engine.Request{Required: []string{ty}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TransferReservation(ctx, resv2, gone); !errors.Is(err, placement.ErrConsumerGone) {
		t.Errorf("transfer to a consumer without allocations: %v, want ErrConsumerGone", err)
	}
	if r, _ := s.Client().Allocations(ctx, resv2); len(r.Providers) != 1 {
		t.Errorf("reservation after the failed transfer: %+v, want it kept", r)
	}
	if err := s.Release(ctx, resv2, ""); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Client().Allocations(ctx, resv2); len(r.Providers) != 0 {
		t.Errorf("reservation after release: %+v", r)
	}
}
