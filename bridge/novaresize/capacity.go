package novaresize

import (
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// DryRun is Capacity from the placement feature's dry run on its mirror.
type DryRun struct{ S *placement.Service }

// SoleType implements Capacity from the mirror's GPUs.
func (d DryRun) SoleType(trait string) (bool, error) { return soleType(d.S.Index().GPUs(), trait), nil }

// soleType reports whether there are GPUs with VGPU inventory and every
// one of them offers exactly the type trait (a GPU whose type is not
// known, with no type trait, could be any).
func soleType(gpus []engine.GPU, trait string) bool {
	n := 0
	for _, g := range gpus {
		if g.Class != nova.ResourceVGPU || g.Capacity() == 0 {
			continue
		}
		if len(g.Types) != 1 || g.Types[0] != trait {
			return false
		}
		n++
	}
	return n > 0
}

// CanFit implements Capacity.
func (d DryRun) CanFit(trait string, count int, hosts []string) (bool, error) {
	var req placement.DryRunRequest
	req.Traits.Required = []string{trait}
	req.Count, req.Limit = max(count, 1), engine.MaxLimit
	out, err := d.S.DryRun(req)
	if err != nil {
		return false, err
	}
	ok := map[string]bool{}
	for _, h := range hosts {
		ok[h] = true
	}
	for _, c := range out.Candidates {
		if !c.NeedsRetype && (ok[c.Host] || ok[c.Node]) {
			return true, nil
		}
	}
	return false, nil
}
