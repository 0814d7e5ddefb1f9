// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Errors of the store.
var (
	// ErrBusy: the host has a running operation already.
	ErrBusy = errors.New("a maintenance operation is running on the host already")
	// ErrNotFound: no such operation, or no such VM in it.
	ErrNotFound = errors.New("not found")
	// ErrIllegal: a state change the VM's state does not allow.
	ErrIllegal = errors.New("illegal state change")
)

// Operation states.
const (
	OpRunning   = "running"
	OpSucceeded = "succeeded"
	OpFailed    = "failed"
)

// Operation is one maintenance operation as the API answers it.
type Operation struct {
	ID          uuid.UUID  `json:"id"`
	Host        string     `json:"host"`
	State       string     `json:"state"`
	Options     Options    `json:"options"`
	DrainedByOp bool       `json:"drained_by_operation"`
	CreatedBy   string     `json:"created_by"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	VMs         []VMStatus `json:"vms"`
}

// VMStatus is one VM's progress.
type VMStatus struct {
	VMPlan
	State       State      `json:"state"`
	Reservation *uuid.UUID `json:"reservation_consumer,omitempty"`
	Migration   *uuid.UUID `json:"migration_uuid,omitempty"`
	UpdatedAt   time.Time  `json:"updated_at"`
}

// Update is what a state change records besides the state; nil and ""
// fields keep what is there.
type Update struct {
	Reason      string
	Target      string
	Reservation *uuid.UUID
	Migration   *uuid.UUID
}

// Store keeps operations in Postgres; every state change is committed
// with its audit_log row.
type Store struct {
	pool *pgxpool.Pool
	log  *slog.Logger
}

// NewStore returns a store over pool.
func NewStore(pool *pgxpool.Pool, log *slog.Logger) *Store {
	if log == nil {
		log = slog.Default()
	}
	return &Store{pool: pool, log: log}
}

// Audit object types and actions.
const (
	auditOp     = "maintenance"
	auditVM     = "maintenance_vm"
	actStart    = "maintenance.start"
	actVM       = "maintenance.vm"
	actFinished = "maintenance.finish"
)

// Create records a new operation for p (VMs pending; skipped ones failed
// at once with their reason, since they stay on the host). drainedByOp
// says the operation drained the host (and so undrains it). A host with
// a running operation gives ErrBusy.
func (s *Store) Create(ctx context.Context, who controls.Actor, p Plan, drainedByOp bool) (Operation, error) {
	id := uuid.New()
	opts, err := json.Marshal(p.Options)
	if err != nil {
		return Operation{}, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO maintenance_operations (id, host, options, drained_by_op, created_by)
			VALUES ($1, $2, $3, $4, $5)`, id, p.Host, opts, drainedByOp, who.Name); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "23505" {
				return fmt.Errorf("host %s: %w", p.Host, ErrBusy)
			}
			return err
		}
		for i, v := range p.VMs {
			steps, _ := json.Marshal(v.Steps)
			state, reason := Pending, ""
			if v.Action == Skip {
				state, reason = Failed, "not moved: "+v.Reason
			}
			if _, err := tx.Exec(ctx, `INSERT INTO maintenance_vms (operation_id, instance_uuid, seq, name, path, action, target, state, reason, steps)
				VALUES ($1, $2, $3, nullif($4,''), nullif($5,''), $6, nullif($7,''), $8, nullif($9,''), $10)`,
				id, v.Instance, i, v.Name, string(v.Path), string(v.Action), v.Target, string(state), reason, steps); err != nil {
				return fmt.Errorf("record VM %s: %w", v.Instance, err)
			}
			if state == Failed {
				if err := controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: actVM, ObjectType: auditVM, ObjectID: id.String() + "/" + v.Instance,
					Detail: map[string]any{"host": p.Host, "from": Pending, "to": Failed, "reason": reason}}); err != nil {
					return err
				}
			}
		}
		return controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: actStart, ObjectType: auditOp, ObjectID: id.String(),
			Detail: map[string]any{"host": p.Host, "options": p.Options, "vms": len(p.VMs), "moves": p.Moves(), "drained_by_operation": drainedByOp}})
	})
	if err != nil {
		return Operation{}, fmt.Errorf("maintenance of %s: %w", p.Host, err)
	}
	s.log.Info("maintenance: operation started", logkey.Host, p.Host, "operation", id, "vms", len(p.VMs), logkey.Actor, who.Name)
	return s.Get(ctx, id)
}

// Advance moves one VM of an operation to state to, recording u, with
// its audit row, in one transaction. Asking for the state the VM is in
// changes nothing and reports changed false (a retried command); a change
// Allowed refuses is ErrIllegal.
func (s *Store) Advance(ctx context.Context, who controls.Actor, op uuid.UUID, instance string, to State, u Update) (_ VMStatus, changed bool, err error) {
	var out VMStatus
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var from State
		var host string
		err := tx.QueryRow(ctx, `SELECT v.state, o.host FROM maintenance_vms v JOIN maintenance_operations o ON o.id = v.operation_id
			WHERE v.operation_id = $1 AND v.instance_uuid = $2 FOR UPDATE OF v`, op, instance).Scan(&from, &host)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("VM %s of operation %s: %w", instance, op, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if from != to {
			if !Allowed(from, to) {
				return fmt.Errorf("VM %s of operation %s: %s → %s: %w", instance, op, from, to, ErrIllegal)
			}
			changed = true
		}
		if _, err := tx.Exec(ctx, `UPDATE maintenance_vms SET state = $3, reason = coalesce(nullif($4,''), reason),
				target = coalesce(nullif($5,''), target), reservation_consumer = coalesce($6, reservation_consumer),
				migration_uuid = coalesce($7, migration_uuid), updated_at = now()
			WHERE operation_id = $1 AND instance_uuid = $2`, op, instance, string(to), u.Reason, u.Target, u.Reservation, u.Migration); err != nil {
			return err
		}
		if !changed {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE maintenance_operations SET updated_at = now() WHERE id = $1`, op); err != nil {
			return err
		}
		detail := map[string]any{"host": host, "from": from, "to": to}
		if u.Reason != "" {
			detail["reason"] = u.Reason
		}
		if u.Target != "" {
			detail["target"] = u.Target
		}
		if u.Reservation != nil {
			detail["reservation_consumer"] = u.Reservation.String()
		}
		if u.Migration != nil {
			detail["migration_uuid"] = u.Migration.String()
		}
		return controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: actVM, ObjectType: auditVM, ObjectID: op.String() + "/" + instance, Detail: detail})
	})
	if err != nil {
		return out, false, err
	}
	o, err := s.Get(ctx, op)
	if err != nil {
		return out, changed, err
	}
	for _, v := range o.VMs {
		if v.Instance == instance {
			out = v
		}
	}
	if changed {
		s.log.Info("maintenance: VM state", "operation", op, logkey.Instance, instance, "state", to, logkey.Reason, u.Reason)
	}
	return out, changed, nil
}

// Finish ends a running operation once every VM is final: succeeded when
// all are done, else failed. It reports ErrIllegal while a VM still moves;
// finishing a finished operation changes nothing.
func (s *Store) Finish(ctx context.Context, who controls.Actor, op uuid.UUID) (Operation, error) {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var state string
		err := tx.QueryRow(ctx, `SELECT state FROM maintenance_operations WHERE id = $1 FOR UPDATE`, op).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("operation %s: %w", op, ErrNotFound)
		}
		if err != nil || state != OpRunning {
			return err
		}
		var open, failed int
		if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state NOT IN ('done','failed')), count(*) FILTER (WHERE state = 'failed')
			FROM maintenance_vms WHERE operation_id = $1`, op).Scan(&open, &failed); err != nil {
			return err
		}
		if open > 0 {
			return fmt.Errorf("operation %s: %d VM(s) still moving: %w", op, open, ErrIllegal)
		}
		end := OpSucceeded
		if failed > 0 {
			end = OpFailed
		}
		if _, err := tx.Exec(ctx, `UPDATE maintenance_operations SET state = $2, finished_at = now(), updated_at = now() WHERE id = $1`, op, end); err != nil {
			return err
		}
		return controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: actFinished, ObjectType: auditOp, ObjectID: op.String(),
			Detail: map[string]any{"state": end, "failed_vms": failed}})
	})
	if err != nil {
		return Operation{}, err
	}
	return s.Get(ctx, op)
}

// Get returns an operation with its VMs in plan order.
func (s *Store) Get(ctx context.Context, id uuid.UUID) (Operation, error) {
	var o Operation
	var opts []byte
	err := s.pool.QueryRow(ctx, `SELECT id, host, state, options, drained_by_op, created_by, created_at, updated_at, finished_at
		FROM maintenance_operations WHERE id = $1`, id).Scan(&o.ID, &o.Host, &o.State, &opts, &o.DrainedByOp, &o.CreatedBy, &o.CreatedAt, &o.UpdatedAt, &o.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, fmt.Errorf("operation %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return o, fmt.Errorf("read operation %s: %w", id, err)
	}
	if err := json.Unmarshal(opts, &o.Options); err != nil {
		return o, fmt.Errorf("operation %s options: %w", id, err)
	}
	rows, err := s.pool.Query(ctx, `SELECT instance_uuid::text, coalesce(name,''), coalesce(path,''), action, coalesce(target,''), state,
			coalesce(reason,''), steps, reservation_consumer, migration_uuid, updated_at
		FROM maintenance_vms WHERE operation_id = $1 ORDER BY seq`, id)
	if err != nil {
		return o, fmt.Errorf("read VMs of operation %s: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v VMStatus
		var path, action, state string
		var steps []byte
		if err := rows.Scan(&v.Instance, &v.Name, &path, &action, &v.Target, &state, &v.Reason, &steps, &v.Reservation, &v.Migration, &v.UpdatedAt); err != nil {
			return o, err
		}
		v.Path, v.Action, v.State = Path(path), Action(action), State(state)
		if err := json.Unmarshal(steps, &v.Steps); err != nil {
			return o, fmt.Errorf("VM %s steps: %w", v.Instance, err)
		}
		o.VMs = append(o.VMs, v)
	}
	return o, rows.Err()
}

// Running lists the running operations' ids, oldest first: what a bridge
// restarted mid-operation resumes.
func (s *Store) Running(ctx context.Context) ([]uuid.UUID, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM maintenance_operations WHERE state = 'running' ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("read running operations: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}
