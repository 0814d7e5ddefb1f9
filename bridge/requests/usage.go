package requests

// vGPU usage: the intervals the accounting (package usage, GET /v1/usage)
// adds up. A direct-path vGPU's interval opens when its attachment is
// marked attached (MarkAttached) and closes when it is released or fails
// (MarkReleased, ReleaseStale, MarkFailed), in the same statement as the
// attachment's change. A flavor's vGPUs follow Nova's notifications
// (SyncFlavorUsage, called by the pipeline for each instance event), at
// the time Nova says the event happened, bounded by when the bridge
// received it (pipeline.AccountFlavor). So nothing rolled back is
// accounted, and the seconds do not depend on when, or by which replica,
// an event was processed.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// clampedAt is the time a direct-path change is accounted at: $2 (the
// agent's time of the command that made it, NULL when unknown), kept
// between the creation of the request (a.request_id) and now, so a
// host's wrong clock cannot move usage before it was asked for or into
// the future.
const clampedAt = `least(now(), greatest((SELECT r.created_at FROM requests r WHERE r.id = a.request_id), coalesce($2::timestamptz, now())))`

// nullTime is t, or NULL when t is zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// FlavorVGPU is one request group of a flavor that gives vGPUs.
type FlavorVGPU struct {
	Profile       string // "" when the group names no known type
	VGPUType      string
	ResourceClass string
	Amount        int
}

// FlavorHolding is what an instance's flavor gives it at one moment.
// VGPUs is empty when it gives none: a flavor without vGPUs, no host, a
// state that holds no resources on a host (HoldsVGPU) or a deleted
// instance.
type FlavorHolding struct {
	Instance, Project, User, Host, Flavor string
	VGPUs                                 []FlavorVGPU
	// Deleted: the instance is gone (Nova deleted it). Its intervals end
	// whatever the event's time, and never before they began.
	Deleted bool
}

// HoldsVGPU reports whether an instance in Nova vm_state state holds its
// flavor's resources on its host: from the launch (active) until it is
// deleted or shelved offloaded; building, error and soft-deleted
// instances are not accounted.
func HoldsVGPU(state string) bool {
	switch state {
	case "active", "paused", "suspended", "stopped", "rescued", "resized", "shelved":
		return true
	}
	return false
}

type openFlavor struct {
	id      int64
	started time.Time
	key     flavorKey
}

type flavorKey struct {
	host, flavor, profile, vgpuType, class string
	amount                                 int
}

func keyOf(host, flavor string, v FlavorVGPU) flavorKey {
	return flavorKey{host: host, flavor: flavor, profile: v.Profile, vgpuType: v.VGPUType, class: v.ResourceClass, amount: v.Amount}
}

func compareKeys(a, b flavorKey) int {
	for _, c := range [...]int{cmpStr(a.host, b.host), cmpStr(a.flavor, b.flavor), cmpStr(a.profile, b.profile),
		cmpStr(a.vgpuType, b.vgpuType), cmpStr(a.class, b.class), a.amount - b.amount} {
		if c != 0 {
			return c
		}
	}
	return 0
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// SyncFlavorUsage makes the instance's open flavor intervals match h as
// of at (Nova's time of the event): when they differ, the open ones end
// at at and h's begin there. An event older than the open intervals (one
// delivered out of order) changes nothing, except a delete (h.Deleted):
// it ends them at at, or where they began if at is earlier. It reports
// whether it changed anything.
func SyncFlavorUsage(ctx context.Context, tx pgx.Tx, h FlavorHolding, at time.Time) (bool, error) {
	if at.IsZero() {
		at = time.Now()
	}
	if h.Deleted {
		tag, err := tx.Exec(ctx, `UPDATE vgpu_usage SET ended_at = greatest(started_at, $2)
			WHERE instance_uuid = $1 AND path = 'flavor' AND ended_at IS NULL`, h.Instance, at)
		if err != nil {
			return false, fmt.Errorf("close flavor usage of deleted %s: %w", h.Instance, err)
		}
		return tag.RowsAffected() > 0, nil
	}
	if len(h.VGPUs) == 0 {
		// Most events: an instance without vGPUs, one statement.
		tag, err := tx.Exec(ctx, `UPDATE vgpu_usage SET ended_at = $2 WHERE instance_uuid = $1 AND path = 'flavor' AND ended_at IS NULL
			AND started_at <= $2`, h.Instance, at)
		if err != nil {
			return false, fmt.Errorf("close flavor usage of %s: %w", h.Instance, err)
		}
		return tag.RowsAffected() > 0, nil
	}
	rows, err := tx.Query(ctx, `SELECT id, started_at, coalesce(host,''), coalesce(flavor,''), coalesce(profile,''), coalesce(vgpu_type,''),
			resource_class, amount
		FROM vgpu_usage WHERE instance_uuid = $1 AND path = 'flavor' AND ended_at IS NULL FOR UPDATE`, h.Instance)
	if err != nil {
		return false, fmt.Errorf("read flavor usage of %s: %w", h.Instance, err)
	}
	var open []openFlavor
	var o openFlavor
	_, err = pgx.ForEachRow(rows, []any{&o.id, &o.started, &o.key.host, &o.key.flavor, &o.key.profile, &o.key.vgpuType, &o.key.class, &o.key.amount},
		func() error { open = append(open, o); return nil })
	if err != nil {
		return false, fmt.Errorf("read flavor usage of %s: %w", h.Instance, err)
	}
	want := make([]flavorKey, 0, len(h.VGPUs))
	for _, v := range h.VGPUs {
		if v.Amount > 0 {
			want = append(want, keyOf(h.Host, h.Flavor, v))
		}
	}
	have := make([]flavorKey, len(open))
	var ids []int64
	for i, o := range open {
		have[i] = o.key
		ids = append(ids, o.id)
		if o.started.After(at) {
			return false, nil // an older event, delivered late
		}
	}
	slices.SortFunc(want, compareKeys)
	slices.SortFunc(have, compareKeys)
	if slices.Equal(want, have) {
		return false, nil
	}
	if len(ids) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE vgpu_usage SET ended_at = $2 WHERE id = ANY($1)`, ids, at); err != nil {
			return false, fmt.Errorf("close flavor usage of %s: %w", h.Instance, err)
		}
	}
	for _, k := range want {
		if _, err := tx.Exec(ctx, `INSERT INTO vgpu_usage (path, instance_uuid, project_id, user_id, host, profile, vgpu_type, resource_class,
				amount, flavor, started_at)
			VALUES ('flavor', $1, nullif($2,''), nullif($3,''), $4, $5, nullif($6,''), $7, $8, nullif($9,''), $10)`,
			h.Instance, h.Project, h.User, k.host, k.profile, k.vgpuType, k.class, k.amount, k.flavor, at); err != nil {
			return false, fmt.Errorf("open flavor usage of %s: %w", h.Instance, err)
		}
	}
	return true, nil
}
