// SPDX-License-Identifier: Apache-2.0

// Package fleetupgrade rolls a vGPU-manager (host driver) upgrade over a
// list of hosts (vgpuctl fleet upgrade): host by host, at most
// MaxUnavailable at a time, each host is drained, its vGPU VMs moved off
// (the host maintenance operation, bridge/maintenance), the agent's own
// configured upgrade command run (a signed upgrade_driver command), the
// new driver awaited in the agent's reports, the agent's diagnostics run
// as a gate, and the host undrained. Before anything, a target branch
// that the driver-compatibility data says cannot serve the guests' drivers
// is refused.
//
// Every step is a row change in Postgres (fleet_upgrade_hosts) with its
// audit record, written before the next step starts and holding the ids
// of what the step started, so a bridge restarted in the middle resumes
// each host at its step, waiting on the same maintenance operation or
// command. A failure stops the run by default (the failed host stays
// drained, its VMs elsewhere).
package fleetupgrade

import (
	"cmp"
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
	"github.com/vgpu-bridge/vgpu-bridge/placement/novaconf"
)

// State is a host's step.
type State string

// Host states, in order.
const (
	Pending    State = "pending"
	Draining   State = "draining"
	Evacuating State = "evacuating"
	Upgrading  State = "upgrading"
	Verifying  State = "verifying"
	Gating     State = "gating"
	Undraining State = "undraining"
	Done       State = "done"
	Failed     State = "failed"
)

// Final reports whether s ends a host's run.
func (s State) Final() bool { return s == Done || s == Failed }

// Operation states.
const (
	OpRunning = "running"
	OpDone    = "done"
	OpFailed  = "failed"
)

// Audit actions and object type.
const (
	auditObject = "fleet_upgrade"
	actStart    = "fleet_upgrade.start"
	actHost     = "fleet_upgrade.host"
	actFinish   = "fleet_upgrade.finish"
	// actRetypeStart starts a re-type run (its steps are actHost records).
	actRetypeStart = "fleet_upgrade.retype_start"
)

// ErrNotFound: no such operation. ErrBusy: a host is in another running
// upgrade.
var (
	ErrNotFound = errors.New("fleet upgrade not found")
	ErrBusy     = errors.New("host is in another running fleet upgrade")
)

// Kinds of run.
const (
	KindUpgrade = "upgrade"
	KindRetype  = "retype"
)

// Options of a run.
type Options struct {
	// Kind is KindUpgrade ("" too) or KindRetype: a re-type of Nova-owned
	// mdev GPUs, Retypes the change of each host (Hosts, in order).
	Kind           string                     `json:"kind,omitempty"`
	Retypes        map[string]novaconf.Change `json:"retypes,omitempty"`
	Branch         string                     `json:"branch"`
	Version        string                     `json:"version,omitempty"`
	Hosts          []string                   `json:"hosts"`
	MaxUnavailable int                        `json:"max_unavailable"`
	StopOnFailure  bool                       `json:"stop_on_failure"`
}

// HostStatus is one host of an operation.
type HostStatus struct {
	Host           string     `json:"host"`
	Seq            int        `json:"seq"`
	State          State      `json:"state"`
	FromDriver     string     `json:"from_driver,omitempty"`
	ToDriver       string     `json:"to_driver,omitempty"`
	DrainedByOp    bool       `json:"drained_by_operation"`
	MaintenanceID  *uuid.UUID `json:"maintenance_id,omitempty"`
	UpgradeCommand *uuid.UUID `json:"upgrade_command,omitempty"`
	GateCommand    *uuid.UUID `json:"gate_command,omitempty"`
	// Retype is the host's nova.conf change (a re-type run).
	Retype    *novaconf.Change `json:"retype,omitempty"`
	Output    string           `json:"output,omitempty"`
	Error     string           `json:"error,omitempty"`
	UpdatedAt time.Time        `json:"updated_at"`
}

// Operation is one fleet upgrade.
type Operation struct {
	ID             uuid.UUID    `json:"id"`
	Kind           string       `json:"kind"`
	Branch         string       `json:"branch"`
	Version        string       `json:"version,omitempty"`
	MaxUnavailable int          `json:"max_unavailable"`
	StopOnFailure  bool         `json:"stop_on_failure"`
	State          string       `json:"state"`
	Error          string       `json:"error,omitempty"`
	CreatedBy      string       `json:"created_by"`
	CreatedAt      time.Time    `json:"created_at"`
	FinishedAt     *time.Time   `json:"finished_at,omitempty"`
	Hosts          []HostStatus `json:"hosts"`
}

// Update is what a host's step records besides its state.
type Update struct {
	FromDriver, ToDriver, Output, Error string
	DrainedByOp                         *bool
	MaintenanceID                       *uuid.UUID
	UpgradeCommand, GateCommand         *uuid.UUID
}

// Store reads and writes fleet upgrades.
type Store struct {
	pool *pgxpool.Pool
	log  *slog.Logger
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{pool: pool, log: log}
}

// Create records a new running operation with its hosts pending, and its
// audit record, in one transaction.
func (s *Store) Create(ctx context.Context, who controls.Actor, o Options) (Operation, error) {
	id := uuid.New()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var busy string
		err := tx.QueryRow(ctx, `SELECT h.host FROM fleet_upgrade_hosts h JOIN fleet_upgrades u ON u.id = h.upgrade_id
			WHERE u.state = 'running' AND h.host = ANY($1) LIMIT 1`, o.Hosts).Scan(&busy)
		if err == nil {
			return fmt.Errorf("%s: %w", busy, ErrBusy)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO fleet_upgrades (id, kind, branch, version, max_unavailable, stop_on_failure, created_by)
			VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7)`, id, cmp.Or(o.Kind, KindUpgrade), o.Branch, o.Version, o.MaxUnavailable,
			o.StopOnFailure, who.Name); err != nil {
			return fmt.Errorf("record fleet upgrade: %w", err)
		}
		for i, h := range o.Hosts {
			var retype []byte
			if c, ok := o.Retypes[h]; ok {
				var err error
				if retype, err = json.Marshal(c); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO fleet_upgrade_hosts (upgrade_id, host, seq, from_driver, retype)
				VALUES ($1, $2, $3, (SELECT driver_version FROM hosts WHERE name = $2), $4)`, id, h, i, retype); err != nil {
				return fmt.Errorf("record host %s: %w", h, err)
			}
		}
		action := actStart
		if o.Kind == KindRetype {
			action = actRetypeStart
		}
		return controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: action, ObjectType: auditObject, ObjectID: id.String(),
			Detail: o})
	})
	if err != nil {
		return Operation{}, fmt.Errorf("fleet upgrade to %s: %w", o.Branch, err)
	}
	s.log.Info("fleet upgrade: started", "operation", id, "branch", o.Branch, "hosts", o.Hosts, logkey.Actor, who.Name)
	return s.Get(ctx, id)
}

// Advance moves host of op to state to, recording u, with its audit
// record, in one transaction; also, when given, runs in it too (queues
// the command the step starts, so that the step and its command commit
// together).
func (s *Store) Advance(ctx context.Context, who controls.Actor, op uuid.UUID, host string, to State, u Update,
	also func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if also != nil {
			if err := also(tx); err != nil {
				return err
			}
		}
		var from State
		if err := tx.QueryRow(ctx, `SELECT state FROM fleet_upgrade_hosts WHERE upgrade_id = $1 AND host = $2 FOR UPDATE`,
			op, host).Scan(&from); err != nil {
			return fmt.Errorf("fleet upgrade %s host %s: %w", op, host, err)
		}
		if from.Final() {
			return fmt.Errorf("fleet upgrade %s host %s is %s already", op, host, from)
		}
		_, err := tx.Exec(ctx, `UPDATE fleet_upgrade_hosts SET state = $3,
				from_driver = coalesce(nullif($4, ''), from_driver), to_driver = coalesce(nullif($5, ''), to_driver),
				output = coalesce(nullif($6, ''), output), error = nullif($7, ''),
				drained_by_op = coalesce($8, drained_by_op), maintenance_id = coalesce($9, maintenance_id),
				upgrade_command = coalesce($10, upgrade_command), gate_command = coalesce($11, gate_command), updated_at = now()
			WHERE upgrade_id = $1 AND host = $2`, op, host, string(to), u.FromDriver, u.ToDriver, u.Output, u.Error,
			u.DrainedByOp, u.MaintenanceID, u.UpgradeCommand, u.GateCommand)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			return fmt.Errorf("%s: %w", host, ErrBusy)
		}
		if err != nil {
			return fmt.Errorf("advance %s to %s: %w", host, to, err)
		}
		detail := map[string]any{"host": host, "from": from, "to": to}
		if u.Error != "" {
			detail["error"] = u.Error
		}
		for k, v := range map[string]*uuid.UUID{"maintenance_id": u.MaintenanceID, "upgrade_command": u.UpgradeCommand, "gate_command": u.GateCommand} {
			if v != nil {
				detail[k] = v.String()
			}
		}
		if u.ToDriver != "" {
			detail["driver"] = u.ToDriver
		}
		return controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: actHost, ObjectType: auditObject,
			ObjectID: op.String() + "/" + host, Detail: detail})
	})
}

// Finish ends op as state (done or failed) with its audit record.
func (s *Store) Finish(ctx context.Context, who controls.Actor, op uuid.UUID, state, msg string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE fleet_upgrades SET state = $2, error = nullif($3, ''), finished_at = now()
			WHERE id = $1 AND state = 'running'`, op, state, msg)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		return controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: actFinish, ObjectType: auditObject, ObjectID: op.String(),
			Detail: map[string]any{"state": state, "error": msg}})
	})
}

// Get reads op with its hosts.
func (s *Store) Get(ctx context.Context, id uuid.UUID) (Operation, error) {
	var op Operation
	var version, errText *string
	err := s.pool.QueryRow(ctx, `SELECT id, kind, branch, version, max_unavailable, stop_on_failure, state, error, created_by, created_at, finished_at
		FROM fleet_upgrades WHERE id = $1`, id).Scan(&op.ID, &op.Kind, &op.Branch, &version, &op.MaxUnavailable, &op.StopOnFailure, &op.State,
		&errText, &op.CreatedBy, &op.CreatedAt, &op.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Operation{}, fmt.Errorf("read fleet upgrade %s: %w", id, err)
	}
	op.Version, op.Error = deref(version), deref(errText)
	rows, err := s.pool.Query(ctx, `SELECT host, seq, state, coalesce(from_driver, ''), coalesce(to_driver, ''), drained_by_op,
			maintenance_id, upgrade_command, gate_command, coalesce(output, ''), coalesce(error, ''), updated_at, retype
		FROM fleet_upgrade_hosts WHERE upgrade_id = $1 ORDER BY seq`, id)
	if err != nil {
		return Operation{}, err
	}
	op.Hosts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (HostStatus, error) {
		var h HostStatus
		var retype []byte
		err := r.Scan(&h.Host, &h.Seq, &h.State, &h.FromDriver, &h.ToDriver, &h.DrainedByOp, &h.MaintenanceID, &h.UpgradeCommand,
			&h.GateCommand, &h.Output, &h.Error, &h.UpdatedAt, &retype)
		if err == nil && retype != nil {
			h.Retype = &novaconf.Change{}
			err = json.Unmarshal(retype, h.Retype)
		}
		return h, err
	})
	if err != nil {
		return Operation{}, fmt.Errorf("read fleet upgrade %s hosts: %w", id, err)
	}
	return op, nil
}

// Running lists the running operations, oldest first.
func (s *Store) Running(ctx context.Context) ([]uuid.UUID, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM fleet_upgrades WHERE state = 'running' ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
