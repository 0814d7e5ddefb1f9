// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// Evacuate starts a maintenance operation that moves every vGPU VM off
// host, which the caller has drained (a fleet upgrade, bridge/fleetupgrade),
// with the [maintenance] defaults; the operation leaves the drain as it
// is. It returns the operation's id, or uuid.Nil when no VM on the host
// holds a vGPU. A host with a running operation returns that one.
func (a *API) Evacuate(ctx context.Context, who controls.Actor, host string) (uuid.UUID, error) {
	if a.Nova == nil {
		return uuid.Nil, errors.New("host maintenance moves VMs through Nova: configure [nova]")
	}
	if busy, err := a.runningOn(ctx, host); err != nil || busy != uuid.Nil {
		return busy, err
	}
	vms, err := a.readVMs(ctx, host)
	if err != nil {
		return uuid.Nil, fmt.Errorf("list the VMs of %s: %w", host, err)
	}
	if len(vms) == 0 {
		return uuid.Nil, nil
	}
	o := DefaultOptions()
	o.LiveMigrateVGPU = a.Defaults.LiveMigrateVGPU
	var ch Chooser
	if a.Chooser != nil {
		ch = a.Chooser()
	}
	p, err := Build(host, true, vms, o, ch)
	if err != nil {
		return uuid.Nil, err
	}
	op, err := a.Store.Create(ctx, who, p, false)
	if errors.Is(err, ErrBusy) {
		return a.runningOn(ctx, host)
	}
	if err != nil {
		return uuid.Nil, err
	}
	if a.Started != nil {
		a.Started()
	}
	return op.ID, nil
}

// Wait waits until operation id is final: nil when every VM moved.
func (a *API) Wait(ctx context.Context, id uuid.UUID) error {
	for {
		op, err := a.Store.Get(ctx, id)
		if err != nil {
			return err
		}
		if op.State != OpRunning {
			var failed []string
			for _, v := range op.VMs {
				if v.State != Done {
					failed = append(failed, fmt.Sprintf("%s (%s)", v.Instance, v.Reason))
				}
			}
			if op.State != OpSucceeded || len(failed) > 0 {
				return fmt.Errorf("maintenance operation %s ended %s; not moved: %v", id, op.State, failed)
			}
			return nil
		}
		if !wake.Wait(ctx, nil, cmp.Or(a.Poll, 2*time.Second)) {
			return ctx.Err()
		}
	}
}
