// SPDX-License-Identifier: Apache-2.0

package fleetupgrade

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/placement/novaconf"
)

// A re-type run (Kind KindRetype, vgpuctl fleet retype) re-types
// Nova-owned mdev GPUs host by host with the fleet upgrade's durable
// steps: pending (the GPUs must be empty) → draining (no new vGPU lands
// on the host; an empty GPU needs no VM moved, so there is no evacuating
// step; the GPUs are checked empty again once drained) → upgrading (the
// agent's own [DEFAULT] gpu_retype_command, sent the nova.conf change in
// a signed retype_gpus command; its output is kept) → verifying (each
// GPU's Placement provider carries the new type's trait and not the old
// one) → undraining → done. A failure leaves the host drained and the
// run failed; the run stops there (stop on failure).

// ErrGPUInUse: a GPU of a re-type holds vGPUs.
var ErrGPUInUse = errors.New("GPU has vGPUs in use")

// RetypeSteps are what a re-type run does on each host.
var RetypeSteps = []string{"check that the GPUs hold no vGPU", "drain (no VM moves: the GPUs are empty); check them empty again",
	"retype_gpus (the agent's gpu_retype_command, the nova.conf change on its standard input)",
	"wait for each GPU's Placement provider to carry the new type's trait", "undrain (when the run drained it)"}

func (r *Runner) retypeStep(ctx context.Context, op Operation, h HostStatus) (State, Update, func(pgx.Tx) error, error) {
	if h.Retype == nil || len(h.Retype.GPUs) == 0 {
		return "", Update{}, nil, errors.New("the run holds no nova.conf change for this host")
	}
	switch h.State {
	case Pending:
		if err := r.checkEmpty(ctx, h.Host, h.Retype.GPUs); err != nil {
			return "", Update{}, nil, err
		}
		var drained bool
		if err := r.Pool.QueryRow(ctx, `SELECT drained FROM hosts WHERE name = $1`, h.Host).Scan(&drained); err != nil {
			return "", Update{}, nil, fmt.Errorf("read host %s: %w", h.Host, err)
		}
		byOp := !drained
		return Draining, Update{DrainedByOp: &byOp}, nil, nil

	case Draining:
		if _, err := r.Drain.DrainHost(ctx, r.Who, h.Host, "fleet retype "+op.ID.String(), true, nil); err != nil {
			return "", Update{}, nil, fmt.Errorf("drain: %w", err)
		}
		// A vGPU that landed before the drain took effect.
		if err := r.checkEmpty(ctx, h.Host, h.Retype.GPUs); err != nil {
			return "", Update{}, nil, err
		}
		p := protocol.RetypeParams{NovaConf: h.Retype.Text}
		for _, g := range h.Retype.GPUs {
			p.GPUs = append(p.GPUs, protocol.RetypeGPU{PCI: g.PCI, From: g.From, To: g.To, Provider: g.Provider,
				ProviderUUID: g.ProviderUUID, FromTrait: g.FromTrait, ToTrait: g.ToTrait})
		}
		cmdID := uuid.New()
		also, err := r.queue(ctx, cmdID, h.Host, protocol.RetypeGPUs, p, cmp.Or(r.CommandTimeout, 45*time.Minute))
		return Upgrading, Update{UpgradeCommand: &cmdID}, also, err

	case Upgrading:
		out, err := r.commandOutput(ctx, *h.UpgradeCommand, "retype_gpus")
		return Verifying, Update{Output: out}, nil, err

	case Verifying:
		if err := r.waitTraits(ctx, h.Retype.GPUs); err != nil {
			return "", Update{}, nil, err
		}
		return Undraining, Update{}, nil, nil

	case Undraining:
		if err := r.undrain(ctx, h); err != nil {
			return "", Update{}, nil, err
		}
		return Done, Update{}, nil, nil
	}
	return "", Update{}, nil, fmt.Errorf("unknown state %q", h.State)
}

// checkEmpty refuses GPUs that host's agent last reported with vGPUs.
func (r *Runner) checkEmpty(ctx context.Context, host string, gpus []novaconf.Retype) error {
	var raw []byte
	if err := r.Pool.QueryRow(ctx, `SELECT report FROM hosts WHERE name = $1`, host).Scan(&raw); err != nil {
		return fmt.Errorf("read host %s: %w", host, err)
	}
	var rep protocol.Report
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &rep); err != nil {
			return fmt.Errorf("host %s report: %w", host, err)
		}
	}
	for _, g := range rep.GPUs {
		if len(g.Active) == 0 || !slices.ContainsFunc(gpus, func(x novaconf.Retype) bool { return strings.EqualFold(x.PCI, g.PCI) }) {
			continue
		}
		var vms []string
		for _, a := range g.Active {
			vms = append(vms, cmp.Or(a.InstanceUUID, a.MdevUUID))
		}
		return fmt.Errorf("GPU %s holds %d vGPU(s) (%s); re-type an empty GPU: %w", g.PCI, len(g.Active), strings.Join(vms, ", "), ErrGPUInUse)
	}
	return nil
}

// waitTraits waits until each GPU's provider carries its new type's trait
// and not its old one: what the host's re-type command set after
// restarting nova-compute (Nova 26's libvirt driver writes the GPU
// providers' inventory, not type traits: see doc/source/operations).
func (r *Runner) waitTraits(ctx context.Context, gpus []novaconf.Retype) error {
	if r.Placement == nil {
		return errors.New("no Placement client to verify the re-type with")
	}
	deadline := time.Now().Add(cmp.Or(r.VerifyTimeout, 10*time.Minute))
	for {
		var missing []string
		for _, g := range gpus {
			if g.ProviderUUID == "" {
				return fmt.Errorf("GPU %s: no Placement provider %s known", g.PCI, g.Provider)
			}
			traits, _, err := r.Placement.Traits(ctx, g.ProviderUUID)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				missing = append(missing, fmt.Sprintf("%s (provider %s): %v", g.PCI, g.ProviderUUID, err))
				continue
			}
			if !slices.Contains(traits, g.ToTrait) || (g.FromTrait != "" && g.FromTrait != g.ToTrait && slices.Contains(traits, g.FromTrait)) {
				missing = append(missing, fmt.Sprintf("%s (provider %s) has traits %s, want %s", g.PCI, g.ProviderUUID,
					strings.Join(traits, ","), g.ToTrait))
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the re-type did not show in Placement: %s", strings.Join(missing, "; "))
		}
		if !wake.Wait(ctx, nil, r.poll()) {
			return ctx.Err()
		}
	}
}
