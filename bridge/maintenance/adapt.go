// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// PlacementAdapter is Placement over placement.Service.
type PlacementAdapter struct{ S *placement.Service }

// Reserve implements Placement.
func (a PlacementAdapter) Reserve(ctx context.Context, reservation, instance, host string, need []DirectVGPU) error {
	cur, err := a.S.Client().Allocations(ctx, reservation)
	if err != nil {
		return err
	}
	if len(cur.Providers) > 0 {
		return nil // reserved before a restart
	}
	inst, err := a.S.Client().Allocations(ctx, instance)
	if err != nil {
		return err
	}
	for _, d := range need {
		if _, err := a.S.Claim(ctx, placement.ClaimRequest{Consumer: reservation, ProjectID: inst.ProjectID, UserID: inst.UserID,
			ConsumerType: placement.ReservationConsumerType,
			Request:      engine.Request{Required: []string{d.Trait}, Count: max(d.Amount, 1), Hosts: []string{host}}}); err != nil {
			if rerr := a.S.Release(context.WithoutCancel(ctx), reservation, ""); rerr != nil {
				return errors.Join(err, rerr)
			}
			return err
		}
	}
	return nil
}

// Transfer implements Placement.
func (a PlacementAdapter) Transfer(ctx context.Context, reservation, instance string) error {
	_, err := a.S.TransferReservation(ctx, reservation, instance)
	return err
}

// Release implements Placement.
func (a PlacementAdapter) Release(ctx context.Context, reservation string) error {
	return a.S.Release(ctx, reservation, "")
}

// Restore implements Placement: the units go back into the instance's
// consumer on the GPUs they were on, past the engine (the source host is
// drained), unless it holds them already.
func (a PlacementAdapter) Restore(ctx context.Context, instance string, held []DirectVGPU) error {
	var b placement.Backoff
	for {
		con, err := a.S.Client().Allocations(ctx, instance)
		if err != nil {
			return err
		}
		if con.Generation == nil {
			return fmt.Errorf("restore the vGPUs of %s: %w", instance, placement.ErrConsumerGone)
		}
		want := map[string]map[string]int{}
		for _, d := range held {
			if d.Provider == "" {
				return fmt.Errorf("restore vGPU %s of %s: its GPU is not known", d.Mdev, instance)
			}
			c := cmpStr(d.Class, "VGPU")
			if want[d.Provider] == nil {
				want[d.Provider] = map[string]int{}
			}
			want[d.Provider][c] += max(d.Amount, 1)
		}
		changed := false
		for rp, classes := range want {
			for c, n := range classes {
				if con.Providers[rp][c] < n {
					if con.Providers[rp] == nil {
						con.Providers[rp] = map[string]int{}
					}
					con.Providers[rp][c] = n
					changed = true
				}
			}
		}
		if !changed {
			return nil
		}
		if con.Type == "" {
			con.Type = "INSTANCE"
		}
		err = a.S.Client().PutAllocations(ctx, con)
		a.S.ForgetConsumer(instance) // written around the service's own record of it
		if err == nil {
			for rp, classes := range want {
				for c := range classes {
					a.S.Learn(ctx, rp, instance, c, con.Providers[rp][c]) // the index and the mirror
				}
			}
			return nil
		}
		if !placement.IsConflict(err) && !placement.IsRetryable(err) {
			return fmt.Errorf("restore the vGPUs of %s: %w", instance, err)
		}
		if werr := b.Wait(ctx); werr != nil {
			return fmt.Errorf("restore the vGPUs of %s: %w", instance, err)
		}
	}
}

// PipelineAgents is Agents over the pipeline's inbox.
type PipelineAgents struct {
	Pool *pgxpool.Pool
	Wake func()
	Poll time.Duration
}

// Detach implements Agents.
func (a PipelineAgents) Detach(ctx context.Context, request uuid.UUID, instance string) error {
	return a.record(ctx, pipeline.MaintenanceEvent{Request: request, Instance: instance, Half: pipeline.MaintenanceDetach})
}

// Attach implements Agents.
func (a PipelineAgents) Attach(ctx context.Context, request uuid.UUID, instance, host, node string, vgpus []DirectVGPU) error {
	e := pipeline.MaintenanceEvent{Request: request, Instance: instance, Half: pipeline.MaintenanceAttach, Host: host, Node: node}
	for _, v := range vgpus {
		e.VGPUs = append(e.VGPUs, pipeline.MaintenanceVGPU{Profile: v.Profile, TypeID: v.TypeID, Trait: v.Trait, Amount: max(v.Amount, 1)})
	}
	return a.record(ctx, e)
}

func (a PipelineAgents) record(ctx context.Context, e pipeline.MaintenanceEvent) error {
	if err := pipeline.RecordMaintenance(ctx, a.Pool, e); err != nil {
		return err
	}
	if a.Wake != nil {
		a.Wake()
	}
	return nil
}

// Wait implements Agents.
func (a PipelineAgents) Wait(ctx context.Context, request uuid.UUID) error {
	for {
		var state, reason string
		err := a.Pool.QueryRow(ctx, `SELECT state, coalesce(reason, '') FROM requests WHERE id = $1`, request).Scan(&state, &reason)
		switch {
		case err == nil && state == "succeeded":
			return nil
		case err == nil && (state == "failed" || state == "rejected"):
			return fmt.Errorf("request %s %s: %s", request, state, reason)
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		if err := backoff.Sleep(ctx, cmp.Or(a.Poll, 500*time.Millisecond)); err != nil {
			return fmt.Errorf("request %s: %w", request, err)
		}
	}
}

// Settled implements Agents: it waits a minute at most (Nova may send
// no notifications the bridge hears).
func (a PipelineAgents) Settled(ctx context.Context, instance, kind string, since time.Time) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var done bool
		err := a.Pool.QueryRow(wctx, `SELECT EXISTS (SELECT 1 FROM events WHERE instance_uuid = $1 AND source = 'nova' AND event_type = $2
			AND occurred_at >= $3 AND processed_at IS NOT NULL)`, instance, kind, since).Scan(&done)
		if err == nil && done {
			return nil
		}
		if err := backoff.Sleep(wctx, cmp.Or(a.Poll, 500*time.Millisecond)); err != nil {
			return ctx.Err() // past the minute: go on
		}
	}
}

// Direct reads the instance's direct-path vGPUs: the attached ones, else
// those the detach request released.
func Direct(ctx context.Context, pool *pgxpool.Pool, instance string, detach uuid.UUID) ([]DirectVGPU, error) {
	q := `SELECT id::text, coalesce(profile,''), coalesce(type_id,''), coalesce(trait,''), coalesce(provider_uuid::text,''), coalesce(resource_class,''), amount
		FROM vgpu_attachments WHERE instance_uuid = $1 AND `
	for _, where := range []string{`state = 'attached'`, `release_request_id = $2 AND state IN ('releasing','released')`} {
		args := []any{instance}
		if where != `state = 'attached'` {
			args = append(args, detach)
		}
		rows, err := pool.Query(ctx, q+where+` ORDER BY created_at, id`, args...)
		if err != nil {
			return nil, fmt.Errorf("read the vGPUs of %s: %w", instance, err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DirectVGPU, error) {
			var d DirectVGPU
			return d, r.Scan(&d.Mdev, &d.Profile, &d.TypeID, &d.Trait, &d.Provider, &d.Class, &d.Amount)
		})
		if err != nil || len(out) > 0 {
			return out, err
		}
	}
	return nil, nil
}

// IndexChooser chooses the target of direct-path vGPUs from the
// Placement index: the first host (in name order) with room, counting
// what it chose before, among the hosts Placeable allows (nil: all).
type IndexChooser struct {
	GPUs func() []engine.GPU
	// Placeable says whether the bridge may place on a node: a host with
	// a live agent, not drained or disabled. Placement's providers of
	// other hosts (no agent: nothing could attach there) are not targets.
	Placeable func(node string) bool
	taken     map[string]int // GPU uuid → units chosen
}

// ChooseHost implements Chooser.
func (c *IndexChooser) ChooseHost(need []DirectVGPU, exclude []string) (string, error) {
	if c.taken == nil {
		c.taken = map[string]int{}
	}
	gpus := c.GPUs()
	hosts := map[string]bool{}
	var names []string
	for _, g := range gpus {
		if g.Host != nil && !hosts[g.Host.Name] {
			hosts[g.Host.Name] = true
			names = append(names, g.Host.Name)
		}
	}
	slices.Sort(names)
	for _, h := range names {
		if slices.Contains(exclude, h) || c.Placeable != nil && !c.Placeable(h) {
			continue
		}
		free := map[string]int{}
		for _, g := range gpus {
			if g.Host != nil && g.Host.Name == h {
				for _, t := range g.Types {
					free[t] += g.Free() - c.taken[g.UUID]
				}
			}
		}
		ok := true
		for _, d := range need {
			if free[d.Trait] < max(d.Amount, 1) {
				ok = false
			}
			free[d.Trait] -= max(d.Amount, 1)
		}
		if !ok {
			continue
		}
		for _, d := range need { // count the choice on the host's GPUs
			n := max(d.Amount, 1)
			for _, g := range gpus {
				if g.Host != nil && g.Host.Name == h && slices.Contains(g.Types, d.Trait) && n > 0 {
					k := min(n, g.Free()-c.taken[g.UUID])
					c.taken[g.UUID] += k
					n -= k
				}
			}
		}
		return h, nil
	}
	return "", errors.New("no other host has free units of the vGPUs' types")
}
