// SPDX-License-Identifier: Apache-2.0

package fleetupgrade

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Drainer drains and undrains hosts (controls.Store).
type Drainer interface {
	DrainHost(ctx context.Context, who controls.Actor, name, reason string, drain bool, known func(string) bool) (controls.HostState, error)
}

// Evacuator moves every vGPU VM off a drained host: the host maintenance
// operation (bridge/maintenance).
type Evacuator interface {
	// Evacuate starts the move and returns its operation's id, uuid.Nil
	// when the host has no vGPU VM. Called again for a host whose move
	// is running, it returns that move (a bridge restarted in between).
	Evacuate(ctx context.Context, who controls.Actor, host string) (uuid.UUID, error)
	// Wait waits until the move is final: nil when every VM moved.
	Wait(ctx context.Context, id uuid.UUID) error
}

// TraitReader reads a resource provider's traits (placement.Client).
type TraitReader interface {
	Traits(ctx context.Context, rp string) ([]string, int, error)
}

// Compat is the driver-compatibility data (policy.Compat).
type Compat interface {
	Check(hypervisor, host, guest string) policy.Verdict
}

// Refusal is a guest driver that the target cannot serve.
type Refusal struct {
	Host     string `json:"host"`
	Instance string `json:"instance,omitempty"`
	Guest    string `json:"guest_driver"`
	Reason   string `json:"reason"`
}

// CheckCompat reads the guests' drivers that hosts' agents last reported
// and returns those the target branch (version) cannot serve.
func CheckCompat(ctx context.Context, pool *pgxpool.Pool, c Compat, hosts []string, branch, version string) ([]Refusal, error) {
	if c == nil {
		return nil, nil
	}
	target := cmp.Or(version, branch)
	rows, err := pool.Query(ctx, `SELECT name, report FROM hosts WHERE name = ANY($1) AND report IS NOT NULL ORDER BY name`, hosts)
	if err != nil {
		return nil, fmt.Errorf("read hosts' reports: %w", err)
	}
	type row struct {
		name string
		rep  []byte
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.name, &x.rep)
	})
	if err != nil {
		return nil, fmt.Errorf("read hosts' reports: %w", err)
	}
	var out []Refusal
	for _, x := range list {
		var rep protocol.Report
		if err := json.Unmarshal(x.rep, &rep); err != nil {
			return nil, fmt.Errorf("host %s report: %w", x.name, err)
		}
		for _, g := range rep.GPUs {
			for _, v := range g.Active {
				if v.GuestDriver == "" {
					continue
				}
				if vd := c.Check(rep.Hypervisor, target, v.GuestDriver); !vd.Supported {
					out = append(out, Refusal{Host: x.name, Instance: v.InstanceUUID, Guest: v.GuestDriver, Reason: vd.Reason})
				}
			}
		}
	}
	return out, nil
}

// Runner drives the running operations.
type Runner struct {
	Store  *Store
	Pool   *pgxpool.Pool
	Drain  Drainer
	Evac   Evacuator
	Compat func() Compat // the current data (nil: nothing is refused)
	Who    controls.Actor
	Log    *slog.Logger
	// Poll is how often results, reports and operations are looked at
	// (default 2s); CommandTimeout the life of an upgrade_driver command
	// (default 45m); DriverTimeout how long the new driver may take to
	// appear in the agent's reports after the command (default 5m);
	// GateTimeout the life of the diagnose gate's command (default 5m).
	Poll, CommandTimeout, DriverTimeout, GateTimeout time.Duration
	// Placement reads a GPU provider's traits (placement.Client): a
	// re-type run's verify step waits for the new type's trait there.
	// VerifyTimeout bounds that wait (default 10m).
	Placement     TraitReader
	VerifyTimeout time.Duration
	// AfterStep, when set, runs after each recorded step (a test hook).
	AfterStep func(op uuid.UUID, host string, to State)

	mu      sync.Mutex
	driving map[uuid.UUID]bool
}

func (r *Runner) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

func (r *Runner) poll() time.Duration { return cmp.Or(r.Poll, 2*time.Second) }

// Run drives every running operation (those a previous run of the bridge
// left too) until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	return wake.Loop(ctx, nil, func(ctx context.Context) (time.Duration, error) {
		ids, err := r.Store.Running(ctx)
		if err != nil && ctx.Err() == nil {
			r.log().Warn("fleet upgrade: list running operations", logkey.Err, err)
		}
		for _, id := range ids {
			r.mu.Lock()
			busy := r.driving[id]
			if !busy {
				if r.driving == nil {
					r.driving = map[uuid.UUID]bool{}
				}
				r.driving[id] = true
			}
			r.mu.Unlock()
			if busy {
				continue
			}
			go func() {
				defer func() { r.mu.Lock(); delete(r.driving, id); r.mu.Unlock() }()
				if err := r.Drive(ctx, id); err != nil && ctx.Err() == nil {
					r.log().Warn("fleet upgrade: drive", "operation", id, logkey.Err, err)
				}
			}()
		}
		return r.poll(), nil
	})
}

// lockClass is the first key of the operations' advisory locks.
const lockClass int32 = 0x666c7570 // "flup"

// Drive runs operation id to its end (or until ctx ends: it resumes
// later where it was). Another replica driving it makes it return at once.
func (r *Runner) Drive(ctx context.Context, id uuid.UUID) error {
	conn, err := r.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	key := int32(binary.BigEndian.Uint32(id[:4]))
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, lockClass, key).Scan(&ok); err != nil || !ok {
		return err
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, $2)`, lockClass, key); err != nil {
			_ = conn.Conn().Close(context.Background())
		}
	}()
	ended := make(chan string, 64)
	active := map[string]bool{}
	for {
		op, err := r.Store.Get(ctx, id)
		if err != nil {
			return err
		}
		if op.State != OpRunning {
			return nil
		}
		failed, left := 0, 0
		var next []HostStatus
		for _, h := range op.Hosts {
			switch {
			case h.State == Failed:
				failed++
			case h.State == Done:
			case active[h.Host]:
				left++
			default:
				left++
				next = append(next, h) // in progress (resumed) first: they are in seq order with the pending
			}
		}
		stop := failed > 0 && op.StopOnFailure
		for _, h := range next {
			if stop && h.State == Pending {
				continue // stop on failure: the hosts in progress end, no new one starts
			}
			if len(active) >= op.MaxUnavailable {
				break
			}
			active[h.Host] = true
			go func() {
				r.driveHost(ctx, op, h)
				ended <- h.Host
			}()
		}
		if len(active) == 0 {
			state, msg := OpDone, ""
			if failed > 0 {
				state = OpFailed
				msg = fmt.Sprintf("%d host(s) failed", failed)
				if stop && left > 0 {
					done := "upgraded"
					if op.Kind == KindRetype {
						done = "re-typed"
					}
					msg += fmt.Sprintf("; stopped with %d host(s) not %s", left, done)
				}
			}
			r.log().Info("fleet upgrade: finished", "operation", id, "state", state, "error", msg)
			return r.Store.Finish(context.WithoutCancel(ctx), r.Who, id, state, msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case host := <-ended:
			delete(active, host)
			if cur, err := r.Store.Get(ctx, id); err == nil {
				for _, h := range cur.Hosts {
					if h.Host == host && !h.State.Final() {
						// Its step could not be recorded (the database):
						// it is taken up again after a pause.
						if !wake.Wait(ctx, nil, r.poll()) {
							return ctx.Err()
						}
					}
				}
			}
		}
	}
}

// driveHost runs one host from its recorded step to its end.
func (r *Runner) driveHost(ctx context.Context, op Operation, h HostStatus) {
	log := r.log().With("operation", op.ID, logkey.Host, h.Host)
	for !h.State.Final() {
		to, u, also, err := r.step(ctx, op, h)
		if ctx.Err() != nil {
			return // resumed later
		}
		if err != nil {
			log.Warn("fleet upgrade: host failed", "state", h.State, logkey.Err, err)
			to, u, also = Failed, Update{Error: fmt.Sprintf("%s: %v", h.State, err), Output: u.Output}, nil
		}
		if err := r.Store.Advance(ctx, r.Who, op.ID, h.Host, to, u, also); err != nil {
			log.Error("fleet upgrade: record step", "to", to, logkey.Err, err)
			return
		}
		log.Info("fleet upgrade: host step", "from", h.State, "to", to)
		if r.AfterStep != nil {
			r.AfterStep(op.ID, h.Host, to)
		}
		cur, err := r.Store.Get(ctx, op.ID)
		if err != nil {
			return
		}
		for _, x := range cur.Hosts {
			if x.Host == h.Host {
				h = x
			}
		}
	}
}

// step does the work of h's current state and returns the next one.
func (r *Runner) step(ctx context.Context, op Operation, h HostStatus) (State, Update, func(pgx.Tx) error, error) {
	if op.Kind == KindRetype {
		return r.retypeStep(ctx, op, h)
	}
	switch h.State {
	case Pending:
		var c Compat
		if r.Compat != nil {
			c = r.Compat()
		}
		refused, err := CheckCompat(ctx, r.Pool, c, []string{h.Host}, op.Branch, op.Version)
		if err != nil {
			return "", Update{}, nil, err
		}
		if len(refused) > 0 {
			return "", Update{}, nil, fmt.Errorf("branch %s cannot serve guest driver %s of %s: %s", op.Branch, refused[0].Guest,
				refused[0].Instance, refused[0].Reason)
		}
		var drained bool
		if err := r.Pool.QueryRow(ctx, `SELECT drained FROM hosts WHERE name = $1`, h.Host).Scan(&drained); err != nil {
			return "", Update{}, nil, fmt.Errorf("read host %s: %w", h.Host, err)
		}
		byOp := !drained
		return Draining, Update{DrainedByOp: &byOp}, nil, nil

	case Draining:
		if _, err := r.Drain.DrainHost(ctx, r.Who, h.Host, "fleet upgrade "+op.ID.String()+" to branch "+op.Branch, true, nil); err != nil {
			return "", Update{}, nil, fmt.Errorf("drain: %w", err)
		}
		id, err := r.Evac.Evacuate(ctx, r.Who, h.Host)
		if err != nil {
			return "", Update{}, nil, fmt.Errorf("move the VMs: %w", err)
		}
		return Evacuating, Update{MaintenanceID: &id}, nil, nil

	case Evacuating:
		if h.MaintenanceID != nil && *h.MaintenanceID != uuid.Nil {
			if err := r.Evac.Wait(ctx, *h.MaintenanceID); err != nil {
				return "", Update{}, nil, fmt.Errorf("maintenance operation %s: %w", h.MaintenanceID, err)
			}
		}
		cmdID := uuid.New()
		also, err := r.queue(ctx, cmdID, h.Host, protocol.UpgradeDriver, protocol.UpgradeParams{Branch: op.Branch, Version: op.Version},
			cmp.Or(r.CommandTimeout, 45*time.Minute))
		return Upgrading, Update{UpgradeCommand: &cmdID}, also, err

	case Upgrading:
		out, err := r.commandOutput(ctx, *h.UpgradeCommand, "upgrade_driver")
		return Verifying, Update{Output: out}, nil, err

	case Verifying:
		driver, err := r.waitDriver(ctx, h.Host, op.Branch, op.Version)
		if err != nil {
			return "", Update{}, nil, err
		}
		cmdID := uuid.New()
		also, err := r.queue(ctx, cmdID, h.Host, protocol.CollectDiagnostics, protocol.DiagnosticsParams{},
			cmp.Or(r.GateTimeout, 5*time.Minute))
		return Gating, Update{ToDriver: driver, GateCommand: &cmdID}, also, err

	case Gating:
		res, err := r.result(ctx, *h.GateCommand)
		if err != nil {
			return "", Update{}, nil, err
		}
		if res.Status != protocol.Succeeded {
			return "", Update{}, nil, fmt.Errorf("diagnose %s: %s (%s)", res.Status, res.Message, res.Code)
		}
		if bad := gateFindings(res.Details); bad != "" {
			return "", Update{}, nil, fmt.Errorf("diagnose gate: %s", bad)
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

// queue returns the queueing of a signed (by the relay) command for host
// in the step's transaction.
func (r *Runner) queue(ctx context.Context, id uuid.UUID, host string, kind protocol.Kind, params any, life time.Duration) (func(pgx.Tx) error, error) {
	now := time.Now().UTC()
	c := protocol.Command{V: protocol.Version, ID: id.String(), Kind: kind, Host: host, IssuedAt: now, ExpiresAt: now.Add(life)}
	if err := c.MarshalParams(params); err != nil {
		return nil, err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return func(tx pgx.Tx) error {
		return requests.QueueOperatorCommand(ctx, tx, requests.Command{ID: c.ID, Host: host, Kind: string(kind), Body: body, ExpiresAt: c.ExpiresAt})
	}, nil
}

// result waits for command id's result; a command past its expiry with
// no answer is an error.
func (r *Runner) result(ctx context.Context, id uuid.UUID) (protocol.Result, error) {
	for {
		var status *string
		var body []byte
		var expires time.Time
		err := r.Pool.QueryRow(ctx, `SELECT result_status, result, expires_at FROM commands WHERE id = $1`, id).Scan(&status, &body, &expires)
		if err != nil {
			return protocol.Result{}, fmt.Errorf("command %s: %w", id, err)
		}
		if status != nil {
			var res protocol.Result
			if len(body) > 0 {
				if err := json.Unmarshal(body, &res); err != nil {
					return res, fmt.Errorf("command %s result: %w", id, err)
				}
			}
			res.Status = protocol.Status(*status)
			return res, nil
		}
		if time.Now().After(expires.Add(time.Minute)) {
			return protocol.Result{}, fmt.Errorf("command %s: no answer from the agent before its expiry", id)
		}
		if !wake.Wait(ctx, nil, r.poll()) {
			return protocol.Result{}, ctx.Err()
		}
	}
}

// waitDriver waits until host's agent reports a driver of branch (the
// version, when given).
func (r *Runner) waitDriver(ctx context.Context, host, branch, version string) (string, error) {
	deadline := time.Now().Add(cmp.Or(r.DriverTimeout, 5*time.Minute))
	last := ""
	for {
		var v *string
		if err := r.Pool.QueryRow(ctx, `SELECT driver_version FROM hosts WHERE name = $1`, host).Scan(&v); err != nil {
			return "", fmt.Errorf("read host %s: %w", host, err)
		}
		last = deref(v)
		if ok := (version != "" && last == version) || (version == "" && strings.HasPrefix(last, branch+".")); ok {
			return last, nil
		}
		if time.Now().After(deadline) {
			want := cmp.Or(version, "branch "+branch)
			return "", fmt.Errorf("the agent still reports driver %q, not %s, after the upgrade", last, want)
		}
		if !wake.Wait(ctx, nil, r.poll()) {
			return "", ctx.Err()
		}
	}
}

// gateFindings returns the findings of error or critical severity in a
// collect_diagnostics result's details, each with its evidence (what the
// operator fixes: the module not loaded, the guest's driver), "" when
// there are none.
func gateFindings(details json.RawMessage) string {
	var d struct {
		Diagnostics struct {
			Findings []struct {
				Check    string   `json:"check"`
				Severity string   `json:"severity"`
				Subject  string   `json:"subject"`
				Title    string   `json:"title"`
				Evidence []string `json:"evidence"`
			} `json:"findings"`
		} `json:"diagnostics"`
	}
	if err := json.Unmarshal(details, &d); err != nil {
		return "unreadable diagnostics: " + err.Error()
	}
	var bad []string
	for _, f := range d.Diagnostics.Findings {
		if f.Severity == "error" || f.Severity == "critical" {
			s := fmt.Sprintf("%s %s %s: %s", f.Severity, f.Check, f.Subject, f.Title)
			if len(f.Evidence) > 0 {
				s += " (" + strings.Join(f.Evidence, "; ") + ")"
			}
			bad = append(bad, s)
		}
	}
	return strings.Join(bad, "; ")
}

// commandOutput waits for the result of the host command id (named for
// errors) and gives the output it kept; a result other than succeeded is
// an error.
func (r *Runner) commandOutput(ctx context.Context, id uuid.UUID, name string) (string, error) {
	res, err := r.result(ctx, id)
	var d protocol.UpgradeDetails
	if len(res.Details) > 0 {
		_ = json.Unmarshal(res.Details, &d)
	}
	if err == nil && res.Status != protocol.Succeeded {
		err = fmt.Errorf("%s %s: %s (%s)", name, res.Status, res.Message, res.Code)
	}
	return d.Output, err
}

// undrain gives the host back to placements when the run drained it (an
// operator's own drain stays).
func (r *Runner) undrain(ctx context.Context, h HostStatus) error {
	if !h.DrainedByOp {
		return nil
	}
	if _, err := r.Drain.DrainHost(ctx, r.Who, h.Host, "", false, nil); err != nil {
		return fmt.Errorf("undrain: %w", err)
	}
	return nil
}
