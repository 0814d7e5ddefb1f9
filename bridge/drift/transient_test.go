// SPDX-License-Identifier: Apache-2.0

package drift

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

type typedPlacement struct {
	types map[string]string
	asked []string
}

func (p *typedPlacement) ProviderAllocations(context.Context, string) (map[string]map[string]int, error) {
	return nil, nil
}

func (p *typedPlacement) ReleaseUnits(context.Context, string, string, string, int, int) error {
	return nil
}

func (p *typedPlacement) ConsumerType(_ context.Context, c string) (string, error) {
	p.asked = append(p.asked, c)
	t, ok := p.types[c]
	if !ok {
		return "", errors.New("unreadable")
	}
	return t, nil
}

// TestReadTransient: only consumers holding units and unknown to the
// bridge are asked, once each; MIGRATION and the bridge's reservation type
// are transient, INSTANCE, untyped and unreadable ones are not.
func TestReadTransient(t *testing.T) {
	const (
		mig   = "cccccccc-0000-0000-0000-000000000001"
		resv  = "cccccccc-0000-0000-0000-000000000002"
		other = "cccccccc-0000-0000-0000-000000000003"
		bad   = "cccccccc-0000-0000-0000-000000000004"
		empty = "cccccccc-0000-0000-0000-000000000005"
		provB = "bbbbbbbb-0000-0000-0000-00000000000b"
	)
	p := &typedPlacement{types: map[string]string{mig: ConsumerTypeMigration, resv: placement.ReservationConsumerType, other: "INSTANCE", empty: "MIGRATION"}}
	r := &Reconciler{d: Deps{Placement: p}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s := &Snapshot{
		Allocations: map[string]map[string]int{provA: {instA: 1, mig: 1, other: 1, empty: 0}, provB: {mig: 2, resv: 1, bad: 1}},
		Instances:   map[string]InstanceView{instA: {Known: true}},
	}
	r.readTransient(context.Background(), s)
	want := map[string]string{mig: TransientMigration, resv: TransientReservation}
	if !maps.Equal(s.Transient, want) {
		t.Errorf("Transient = %v, want %v", s.Transient, want)
	}
	if len(p.asked) != 4 {
		t.Errorf("asked %v, want mig, other, resv, bad once each", p.asked)
	}
	for _, c := range p.asked {
		if c == instA || c == empty {
			t.Errorf("asked the type of %s", c)
		}
	}
}

// novaVFPlacement is a Placement whose class CUSTOM_VGPU_VF_1430 is that
// of Nova-owned VF GPUs; it records the providers whose allocations were read.
type novaVFPlacement struct {
	typedPlacement
	read []string
}

func (p *novaVFPlacement) ProviderAllocations(_ context.Context, provider string) (map[string]map[string]int, error) {
	p.read = append(p.read, provider)
	return map[string]map[string]int{instA: {"VGPU": 1, "CUSTOM_VGPU_VF_1430": 1}}, nil
}

func (p *novaVFPlacement) IsNovaVF(class string) bool { return class == "CUSTOM_VGPU_VF_1430" }

// TestReadAllocationsSkipsNovaVFs: the allocations on Nova-owned VF GPUs
// (Nova's PCI claims) are not read, so no finding is made of them; the
// other GPUs' are.
func TestReadAllocationsSkipsNovaVFs(t *testing.T) {
	const provB = "bbbbbbbb-0000-0000-0000-00000000000b"
	p := &novaVFPlacement{}
	r := &Reconciler{d: Deps{Placement: p}, cfg: Config{Concurrency: 2}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s := &Snapshot{GPUs: []GPUView{{Provider: provA, Class: "VGPU"}, {Provider: provB, Class: "CUSTOM_VGPU_VF_1430"}},
		Allocations: map[string]map[string]int{}, Unread: map[string]bool{}}
	if err := r.readAllocations(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if len(p.read) != 1 || p.read[0] != provA {
		t.Errorf("read the allocations of %v, want %s only", p.read, provA)
	}
	if _, ok := s.Allocations[provB]; ok || s.Allocations[provA][instA] != 1 {
		t.Errorf("allocations %v, want %s's only", s.Allocations, provA)
	}
}
