package controls

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// ErrNotFound says no host or GPU has that name or id.
var ErrNotFound = errors.New("not found")

// HostState is a host's marks as the drain routes answer them.
type HostState struct {
	Name           string     `json:"name"`
	Node           string     `json:"node,omitempty"`
	Drained        bool       `json:"drained"`
	DrainReason    string     `json:"drain_reason,omitempty"`
	DrainedBy      string     `json:"drained_by,omitempty"`
	DrainedAt      *time.Time `json:"drained_at,omitempty"`
	Disabled       bool       `json:"disabled"`
	ForcedDown     bool       `json:"forced_down"`
	DisabledReason string     `json:"disabled_reason,omitempty"`
	Changed        bool       `json:"changed"`
}

// GPUState is a GPU's drain as the drain routes answer it.
type GPUState struct {
	ProviderUUID string     `json:"provider_uuid"`
	Node         string     `json:"node,omitempty"`
	PCIAddress   string     `json:"pci_address,omitempty"`
	Drained      bool       `json:"drained"`
	DrainReason  string     `json:"drain_reason,omitempty"`
	DrainedBy    string     `json:"drained_by,omitempty"`
	DrainedAt    *time.Time `json:"drained_at,omitempty"`
	// FaultReason is the fault the GPU is marked for (its agent reported
	// it); undrain clears it.
	FaultReason string     `json:"fault_reason,omitempty"`
	FaultedAt   *time.Time `json:"faulted_at,omitempty"`
	Changed     bool       `json:"changed"`
}

const hostCols = `name, coalesce(node,''), drained, coalesce(drain_reason,''), coalesce(drained_by,''), drained_at,
	disabled, forced_down, coalesce(disabled_reason,'')`

func scanHost(row pgx.Row) (HostState, error) {
	var h HostState
	err := row.Scan(&h.Name, &h.Node, &h.Drained, &h.DrainReason, &h.DrainedBy, &h.DrainedAt, &h.Disabled, &h.ForcedDown, &h.DisabledReason)
	return h, err
}

// DrainHost drains (drain true) or undrains a host named by its compute
// service host or its node name. A name the hosts table lacks is taken
// when known reports it (a node of the Placement mirror without an agent
// yet): its row is created. Draining twice changes nothing and writes no
// second audit row.
func (s *Store) DrainHost(ctx context.Context, who Actor, name, reason string, drain bool, known func(string) bool) (HostState, error) {
	var out HostState
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := scanHost(tx.QueryRow(ctx, `SELECT `+hostCols+` FROM hosts WHERE name = $1 OR node = $1
			ORDER BY (name = $1) DESC LIMIT 1 FOR UPDATE`, name))
		if errors.Is(err, pgx.ErrNoRows) {
			if !drain || known == nil || !known(name) {
				return fmt.Errorf("host %q: %w", name, ErrNotFound)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO hosts (name) VALUES ($1) ON CONFLICT DO NOTHING`, name); err != nil {
				return err
			}
			cur, err = scanHost(tx.QueryRow(ctx, `SELECT `+hostCols+` FROM hosts WHERE name = $1 FOR UPDATE`, name))
		}
		if err != nil {
			return err
		}
		if cur.Drained == drain && (!drain || cur.DrainReason == reason) {
			out = cur
			return nil
		}
		out, err = scanHost(tx.QueryRow(ctx, `UPDATE hosts SET drained = $2,
				drain_reason = CASE WHEN $2 THEN nullif($3,'') END, drained_by = CASE WHEN $2 THEN $4 END,
				drained_at = CASE WHEN $2 THEN coalesce(CASE WHEN drained THEN drained_at END, now()) END, updated_at = now()
			WHERE name = $1 RETURNING `+hostCols, cur.Name, drain, reason, who.Name))
		if err != nil {
			return err
		}
		out.Changed = true
		action := "host.drain"
		if !drain {
			action = "host.undrain"
		}
		return Audit(ctx, tx, Entry{Actor: who, Action: action, ObjectType: "host", ObjectID: cur.Name,
			Detail: map[string]any{"reason": reason, "node": cur.Node, "was_drained": cur.Drained}})
	})
	if err != nil {
		return out, err
	}
	if out.Changed {
		s.log.Info("host drain changed", logkey.Object, out.Name, "drained", out.Drained, logkey.Actor, who.Name, logkey.GlobalRequestID, who.RequestID, logkey.Reason, reason)
	}
	return out, nil
}

const gpuCols = `provider_uuid::text, coalesce(node,''), coalesce(pci_address,''), drained, coalesce(drain_reason,''),
	coalesce(drained_by,''), drained_at, coalesce(fault_reason,''), faulted_at`

func scanGPU(row pgx.Row) (GPUState, error) {
	var g GPUState
	err := row.Scan(&g.ProviderUUID, &g.Node, &g.PCIAddress, &g.Drained, &g.DrainReason, &g.DrainedBy, &g.DrainedAt,
		&g.FaultReason, &g.FaultedAt)
	return g, err
}

// KnownGPU is a GPU the gpus table may lack (a mixed bridge-owned GPU,
// which the Placement mirror does not keep as a GPU): its node and PCI
// address. Its row is created without a resource class, so that the
// drift reconciler, which compares the allocations of the GPUs with one,
// leaves its framebuffer claims alone as it does without the row.
type KnownGPU struct {
	Node, PCIAddress string
}

// GPUKnower finds a GPU the gpus table lacks by provider UUID; ok is
// false when there is none.
type GPUKnower func(ctx context.Context, id string) (g KnownGPU, ok bool, err error)

// DrainGPU drains or undrains a GPU named by its provider UUID. Undrain
// also clears a fault mark (GPUFaults): the operator says the GPU has
// recovered; the placement sync then removes the fault trait. An id the
// gpus table lacks is taken when known finds it (a mixed bridge-owned
// GPU): draining creates its row, undraining it answers it undrained.
func (s *Store) DrainGPU(ctx context.Context, who Actor, id, reason string, drain bool, known GPUKnower) (GPUState, error) {
	if _, err := uuid.Parse(id); err != nil {
		return GPUState{}, fmt.Errorf("GPU %q: %w", id, ErrNotFound)
	}
	var kg KnownGPU
	isKnown := false
	if known != nil {
		// Looked up before the transaction (Placement calls): only for an
		// id the table lacks.
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM gpus WHERE provider_uuid = $1`, id).Scan(&n); err != nil {
			return GPUState{}, err
		}
		if n == 0 {
			var err error
			if kg, isKnown, err = known(ctx, id); err != nil {
				return GPUState{}, fmt.Errorf("GPU %q: %w", id, err)
			}
		}
	}
	var out GPUState
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := scanGPU(tx.QueryRow(ctx, `SELECT `+gpuCols+` FROM gpus WHERE provider_uuid = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			if !isKnown {
				return fmt.Errorf("GPU %q: %w", id, ErrNotFound)
			}
			if !drain {
				out = GPUState{ProviderUUID: id, Node: kg.Node, PCIAddress: kg.PCIAddress}
				return nil
			}
			if _, err := tx.Exec(ctx, `INSERT INTO gpus (provider_uuid, node, pci_address) VALUES ($1, nullif($2,''), nullif($3,''))
				ON CONFLICT DO NOTHING`, id, kg.Node, kg.PCIAddress); err != nil {
				return err
			}
			cur, err = scanGPU(tx.QueryRow(ctx, `SELECT `+gpuCols+` FROM gpus WHERE provider_uuid = $1 FOR UPDATE`, id))
		}
		if err != nil {
			return err
		}
		if cur.Drained == drain && (!drain || cur.DrainReason == reason) && (drain || cur.FaultReason == "") {
			out = cur
			return nil
		}
		out, err = scanGPU(tx.QueryRow(ctx, `UPDATE gpus SET drained = $2,
				drain_reason = CASE WHEN $2 THEN nullif($3,'') END, drained_by = CASE WHEN $2 THEN $4 END,
				drained_at = CASE WHEN $2 THEN coalesce(CASE WHEN drained THEN drained_at END, now()) END,
				fault_reason = CASE WHEN $2 THEN fault_reason END, faulted_at = CASE WHEN $2 THEN faulted_at END
			WHERE provider_uuid = $1 RETURNING `+gpuCols, id, drain, reason, who.Name))
		if err != nil {
			return err
		}
		out.Changed = true
		action := "gpu.drain"
		if !drain {
			action = "gpu.undrain"
		}
		detail := map[string]any{"reason": reason, "node": cur.Node, "pci_address": cur.PCIAddress, "was_drained": cur.Drained}
		if !drain && cur.FaultReason != "" {
			detail["fault_cleared"] = cur.FaultReason
		}
		return Audit(ctx, tx, Entry{Actor: who, Action: action, ObjectType: "gpu", ObjectID: id, Detail: detail})
	})
	if err != nil {
		return out, err
	}
	if out.Changed {
		s.log.Info("GPU drain changed", logkey.Object, id, "drained", out.Drained, logkey.Actor, who.Name, logkey.GlobalRequestID, who.RequestID, logkey.Reason, reason)
	}
	return out, nil
}

var _ placementapi.Marks = (*Store)(nil)

// Marks implements placementapi.Marks: hosts by compute service host and
// by node name, GPUs by provider UUID; unmarked ones are left out.
func (s *Store) Marks(ctx context.Context) (map[string]placementapi.HostMark, map[string]placementapi.GPUMark, error) {
	hosts, gpus := map[string]placementapi.HostMark{}, map[string]placementapi.GPUMark{}
	rows, err := s.pool.Query(ctx, `SELECT `+hostCols+` FROM hosts WHERE drained OR disabled`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		h, err := scanHost(rows)
		if err != nil {
			rows.Close()
			return nil, nil, err
		}
		m := placementapi.HostMark{Drained: h.Drained, DrainReason: h.DrainReason, Disabled: h.Disabled, DisabledReason: h.DisabledReason}
		hosts[h.Name] = m
		if h.Node != "" {
			hosts[h.Node] = m
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rows, err = s.pool.Query(ctx, `SELECT `+gpuCols+` FROM gpus WHERE drained`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		g, err := scanGPU(rows)
		if err != nil {
			return nil, nil, err
		}
		gpus[g.ProviderUUID] = placementapi.GPUMark{Drained: true, DrainReason: g.DrainReason}
	}
	return hosts, gpus, rows.Err()
}
