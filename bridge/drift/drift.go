// Package drift is the bridge's drift reconciler. Every interval one
// replica (a transaction-scoped advisory lock) compares three views of the
// fleet's vGPUs:
//
//   - Placement: the VGPU allocations on every GPU child provider of the
//     hosts that run an agent, read through the Placement API;
//   - the hosts: the vGPUs and mdevs each agent last reported;
//   - the bridge: its direct-path vGPUs (vgpu_attachments) and the
//     instances Nova's notifications told it about.
//
// Each difference is a Finding (orphan_mdev, missing_device, stale_claim,
// unclaimed_device, unknown_instance), kept in drift_findings with when it
// was first and last seen, logged once when new, audited, counted in
// metrics and served by GET /v1/drift. With repair on, the reconciler
// fixes what is safe once a finding has lasted RepairGrace: it removes
// agent-made mdevs no vGPU accounts for (remove_mdev through the outbox,
// signed by the relay like every command) and releases the bridge's own
// Placement claims of deleted instances, or claims the bridge made that
// nothing accounts for any more. Nova's claims and mdevs are never touched.
package drift

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift/driftwire"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// Source is the requests.source of the reconciler's repair requests.
const Source = "drift"

// ErrBusy is returned by RunOnce when another replica is running the
// reconciler.
var ErrBusy = errors.New("another replica is running the drift reconciler")

// lockKey is the advisory lock key text (hashed as the pipeline hashes its
// instance locks).
const lockKey = "vgpu-drift-reconciler"

// Placement is what the reconciler needs of Placement.
type Placement interface {
	// ProviderAllocations returns consumer → resource class → amount on
	// a provider (GET /resource_providers/{uuid}/allocations).
	ProviderAllocations(ctx context.Context, provider string) (map[string]map[string]int, error)
	// ReleaseUnits takes amount units of class off the consumer's
	// allocation on provider, keeping the rest (heldAfter as in
	// pipeline.Placement; 0 here).
	ReleaseUnits(ctx context.Context, consumer, provider, class string, amount, heldAfter int) error
}

// NovaVFClasses is what a Placement may also offer: whether a GPU's
// resource class is that of Nova-owned VF GPUs ([placement]
// nova_vf_resource_classes). Their allocations are Nova's PCI claims,
// which no flavor's resources:VGPU and no bridge vGPU accounts for: the
// reconciler leaves them alone.
type NovaVFClasses interface {
	IsNovaVF(class string) bool
}

// MixedOwned is what a Placement may also offer: the PFs of the mixed
// bridge-owned GPUs ([placement] bridge_owned_gpus HOST/PF=mixed) by
// compute host. Their providers are no GPUs of the mirror, so without it
// the VFs the bridge typed there are never judged.
type MixedOwned interface {
	MixedPFs() map[string][]string
}

// ConsumerTyper is what a Placement may also offer: the Placement
// consumer type of a consumer ("" when it has none, or none is known).
// With it, the consumers the bridge does not know as instances are asked
// for their type, and Nova's migration consumers and the bridge's
// reservations are not reported (Snapshot.Transient).
type ConsumerTyper interface {
	ConsumerType(ctx context.Context, consumer string) (string, error)
}

// Config configures a Reconciler; zero fields take DefaultConfig's values.
type Config struct {
	// Replica names this process in runs, audit rows and logs.
	Replica string
	// Interval is the time between runs.
	Interval time.Duration
	// Repair turns repairs on.
	Repair bool
	// RepairGrace is how long a finding must have lasted before it is
	// repaired (0: at once), so that work in flight is not "repaired".
	RepairGrace time.Duration
	// StaleReportAge: hosts whose last report is older are not judged.
	StaleReportAge time.Duration
	// CommandTimeout is the deadline of a repair's commands.
	CommandTimeout time.Duration
	// Concurrency bounds parallel Placement reads.
	Concurrency int
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.RepairGrace < 0 {
		c.RepairGrace = 0
	}
	if c.StaleReportAge <= 0 {
		c.StaleReportAge = d.StaleReportAge
	}
	if c.CommandTimeout <= 0 {
		c.CommandTimeout = d.CommandTimeout
	}
	if c.Concurrency <= 0 {
		c.Concurrency = d.Concurrency
	}
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
	}
}

// Deps are the reconciler's collaborators.
type Deps struct {
	Pool      *pgxpool.Pool
	Placement Placement
	// Requests records repair requests; nil: a store over Pool.
	Requests *requests.Store
	Log      *slog.Logger
	Registry prometheus.Registerer // may be nil
	// OnOutbox wakes the relay after repair commands were committed.
	OnOutbox func()
	// Hold, when set and true, holds repairs (the operator paused the
	// bridge or set observe-only mode); findings are still recorded.
	Hold func(ctx context.Context) bool
}

// Reconciler finds and repairs drift.
type Reconciler struct {
	cfg Config
	d   Deps
	log *slog.Logger
	m   *metrics
	mu  sync.Mutex // one run at a time in this process
}

// New builds a reconciler.
func New(cfg Config, d Deps) (*Reconciler, error) {
	cfg.setDefaults()
	if d.Pool == nil || d.Placement == nil {
		return nil, errors.New("drift: pool and placement are required")
	}
	if d.Requests == nil {
		d.Requests = requests.NewStore(d.Pool, "vgpu-bridge/"+cfg.Replica)
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{cfg: cfg, d: d, log: d.Log, m: newMetrics(d.Registry)}, nil
}

// Config returns the effective configuration.
func (r *Reconciler) Config() Config { return r.cfg }

// Run runs the reconciler every interval until ctx ends. The first run
// waits one interval: a starting bridge has not heard from its agents yet.
func (r *Reconciler) Run(ctx context.Context) error {
	wake.Every(ctx, r.cfg.Interval, func(ctx context.Context) {
		if _, err := r.RunOnce(ctx); err != nil && !errors.Is(err, ErrBusy) && ctx.Err() == nil {
			r.log.Warn("drift: run failed", logkey.Err, err)
		}
	})
	return nil
}

// RunResult sums up one run.
type RunResult = driftwire.RunResult

// RunOnce runs the reconciler now, unless another replica runs it
// (ErrBusy).
func (r *Reconciler) RunOnce(ctx context.Context) (RunResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := RunResult{Replica: r.cfg.Replica, StartedAt: time.Now().UTC(), SkippedHosts: []string{}}
	kick, err := r.runLocked(ctx, &res)
	switch {
	case errors.Is(err, ErrBusy):
		r.m.runs.WithLabelValues("busy").Inc()
		return res, err
	case err != nil:
		r.m.runs.WithLabelValues("error").Inc()
		res.Error = err.Error()
		res.FinishedAt = time.Now().UTC()
		if ctx.Err() == nil {
			_, _ = r.d.Pool.Exec(context.WithoutCancel(ctx), `INSERT INTO drift_runs (replica, started_at, finished_at, error) VALUES ($1, $2, $3, $4)`,
				res.Replica, res.StartedAt, res.FinishedAt, res.Error)
		}
		return res, err
	}
	r.m.runs.WithLabelValues("ok").Inc()
	if kick && r.d.OnOutbox != nil {
		r.d.OnOutbox()
	}
	if err := r.refreshGauge(ctx); err != nil {
		r.log.Debug("drift: cannot count open findings", logkey.Err, err)
	}
	return res, nil
}

// runLocked runs the reconciler on one connection holding the session
// lock that keeps other replicas' runs out (ErrBusy). No Placement call
// runs inside a transaction: the bridge's views are read in one, Placement's
// with none open, the findings are recorded in a third, and the claims a
// repair gives back are released after it commits, each recorded in a
// transaction of its own once made. It reports whether commands were
// queued.
func (r *Reconciler) runLocked(ctx context.Context, res *RunResult) (kick bool, err error) {
	conn, err := r.d.Pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("drift: %w", err)
	}
	defer conn.Release()
	unlock, got, err := store.TryLock(ctx, conn, lockKey)
	if err != nil {
		return false, fmt.Errorf("drift lock: %w", err)
	}
	if !got {
		return false, ErrBusy
	}
	defer unlock()
	var snap *Snapshot
	var skipped []string
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
		snap, skipped, err = r.load(ctx, tx)
		return err
	}); err != nil {
		return false, err
	}
	res.SkippedHosts = skipped
	if err := r.readAllocations(ctx, snap); err != nil {
		return false, err
	}
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return r.loadNamed(ctx, tx, snap) }); err != nil {
		return false, err
	}
	r.readTransient(ctx, snap) // Placement again, outside any transaction
	found := Detect(snap)
	var releases []release
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		res.Findings, res.New, res.Resolved, res.Repairs, releases = 0, 0, 0, 0, nil
		var err error
		if kick, err = r.persist(ctx, tx, found, skipped, res, &releases); err != nil {
			return err
		}
		res.FinishedAt = time.Now().UTC()
		return tx.QueryRow(ctx, `INSERT INTO drift_runs (replica, started_at, finished_at, findings, new_findings, resolved, repairs, skipped_hosts)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`, res.Replica, res.StartedAt, res.FinishedAt, res.Findings, res.New,
			res.Resolved, res.Repairs, res.SkippedHosts).Scan(&res.ID)
	})
	if err != nil {
		return false, err
	}
	done := 0
	for _, rl := range releases {
		rp := rl.f.Repair
		if err := r.d.Placement.ReleaseUnits(ctx, rp.Consumer, rl.f.Provider, rp.Class, rp.Amount, 0); err != nil {
			r.m.repairs.WithLabelValues(string(rl.f.Kind), "failed").Inc()
			r.log.Warn("drift: cannot release a stale claim; tried again next run", logkey.Instance, rp.Consumer, logkey.Provider, rl.f.Provider, logkey.Err, err)
			continue
		}
		released := fmt.Sprintf("released %d %s unit(s) of consumer %s on provider %s", rp.Amount, rp.Class, rp.Consumer, rl.f.Provider)
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := r.recordRelease(ctx, tx, rl.f, rl.o, released)
			return err
		}); err != nil {
			// Given back and not recorded: the next run finds the claim
			// gone and resolves the finding.
			r.log.Warn("drift: a stale claim was released but the repair could not be recorded", "finding", rl.o.id, logkey.Err, err)
			continue
		}
		done++
	}
	if done > 0 {
		res.Repairs += done
		if _, err := conn.Exec(ctx, `UPDATE drift_runs SET repairs = $2 WHERE id = $1`, res.ID, res.Repairs); err != nil {
			r.log.Warn("drift: cannot count the run's repairs", "run", res.ID, logkey.Err, err)
		}
	}
	return kick, nil
}

// leanReport decodes what drift judges a host by from an agent's report:
// its node, what it could not read (a VF in no domain is an orphan only
// while libvirt answered), and each GPU's address, mode (vendor-VFIO)
// and vGPUs. A fleet's reports are tens of
// MB of JSON; decoding all of each (types, metrics, processes) made every
// run hold them all at once.
func leanReport(raw []byte) (protocol.Report, error) {
	var lr struct {
		Node   string   `json:"node"`
		Errors []string `json:"errors"`
		GPUs   []struct {
			PCI        string `json:"pci"`
			VendorVFIO bool   `json:"vendor_vfio"`
			Active     []struct {
				MdevUUID     string `json:"mdev_uuid"`
				PCI          string `json:"pci"`
				TypeID       string `json:"type_id"`
				InstanceUUID string `json:"instance_uuid"`
				Owner        string `json:"owner"`
			} `json:"active"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(raw, &lr); err != nil {
		return protocol.Report{}, err
	}
	r := protocol.Report{Node: lr.Node, Errors: lr.Errors, GPUs: make([]protocol.GPU, len(lr.GPUs))}
	for i, g := range lr.GPUs {
		r.GPUs[i].PCI, r.GPUs[i].VendorVFIO = g.PCI, g.VendorVFIO
		if len(g.Active) > 0 {
			r.GPUs[i].Active = make([]protocol.VGPU, len(g.Active))
			for j, v := range g.Active {
				r.GPUs[i].Active[j] = protocol.VGPU{MdevUUID: v.MdevUUID, PCI: v.PCI, TypeID: v.TypeID, InstanceUUID: v.InstanceUUID, Owner: v.Owner}
			}
		}
	}
	return r, nil
}

// release is a stale claim a repair gives back after the findings are
// recorded.
type release struct {
	f Finding
	o *open
}

// load reads the bridge's views of hosts, GPUs and vGPUs (loadNamed
// reads the rest once Placement's view is in).
func (r *Reconciler) load(ctx context.Context, tx pgx.Tx) (*Snapshot, []string, error) {
	s := &Snapshot{Now: time.Now(), Hosts: map[string]HostView{}, Allocations: map[string]map[string]int{}, Unread: map[string]bool{},
		Made: map[string]bool{}, Instances: map[string]InstanceView{}}
	skipped := []string{}
	rows, err := tx.Query(ctx, `SELECT name, coalesce(node,''), last_report_at, report FROM hosts WHERE report IS NOT NULL ORDER BY name`)
	if err != nil {
		return nil, nil, fmt.Errorf("read hosts: %w", err)
	}
	for rows.Next() {
		var h HostView
		var at *time.Time
		var raw []byte
		if err := rows.Scan(&h.Name, &h.Node, &at, &raw); err != nil {
			rows.Close()
			return nil, nil, err
		}
		if h.Report, err = leanReport(raw); err != nil {
			continue
		}
		if at != nil {
			h.ReportAt = *at
		}
		h.Fresh = at != nil && s.Now.Sub(*at) <= r.cfg.StaleReportAge
		if !h.Fresh {
			skipped = append(skipped, h.Name)
		}
		s.Hosts[h.Name] = h
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}

	rows, err = tx.Query(ctx, `SELECT provider_uuid::text, coalesce(host,''), coalesce(node,''), coalesce(pci_address,''), resource_class
		FROM gpus WHERE resource_class IS NOT NULL ORDER BY provider_uuid`)
	if err != nil {
		return nil, nil, fmt.Errorf("read gpus: %w", err)
	}
	for rows.Next() {
		var g GPUView
		if err := rows.Scan(&g.Provider, &g.Host, &g.Node, &g.PCI, &g.Class); err != nil {
			rows.Close()
			return nil, nil, err
		}
		s.GPUs = append(s.GPUs, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	// A GPU's compute host comes from the reports. GPUs of nodes no agent
	// reports for are Nova's alone: the bridge does not judge them.
	byNode := map[string]string{}
	for _, h := range s.Hosts {
		byNode[h.Node] = h.Name
	}
	mine := s.GPUs[:0]
	for _, g := range s.GPUs {
		if h, ok := byNode[g.Node]; ok {
			g.Host = h
			mine = append(mine, g)
		}
	}
	s.GPUs = mine
	if mo, ok := r.d.Placement.(MixedOwned); ok {
		s.Mixed = map[string]bool{}
		for host, pfs := range mo.MixedPFs() {
			for _, pf := range pfs {
				s.Mixed[host+"|"+strings.ToLower(pf)] = true
			}
		}
	}

	rows, err = tx.Query(ctx, `SELECT id::text, instance_uuid::text, host, coalesce(provider_uuid::text,''), coalesce(pci_address,''),
			coalesce(resource_class,''), coalesce(profile,''), amount, coalesce(held_after,0), state, updated_at
		FROM vgpu_attachments WHERE state IN ('pending','attached','releasing','kept') ORDER BY created_at, id`)
	if err != nil {
		return nil, nil, fmt.Errorf("read attachments: %w", err)
	}
	for rows.Next() {
		var a AttachmentView
		if err := rows.Scan(&a.ID, &a.Instance, &a.Host, &a.Provider, &a.PCI, &a.Class, &a.Profile, &a.Amount, &a.HeldAfter, &a.State, &a.UpdatedAt); err != nil {
			rows.Close()
			return nil, nil, err
		}
		s.Attachments = append(s.Attachments, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}

	return s, skipped, nil
}

// loadNamed reads the instances and the bridge's claims that the three
// views name.
func (r *Reconciler) loadNamed(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	ids := map[string]bool{}
	for _, a := range s.Attachments {
		ids[a.Instance] = true
	}
	for _, cons := range s.Allocations {
		for c := range cons {
			ids[c] = true
		}
	}
	for _, h := range s.Hosts {
		for _, g := range h.Report.GPUs {
			for _, v := range g.Active {
				if protocol.ValidUUID(v.InstanceUUID) {
					ids[v.InstanceUUID] = true
				}
			}
		}
	}
	list := make([]string, 0, len(ids))
	for id := range ids {
		if protocol.ValidUUID(id) {
			list = append(list, id)
		}
	}
	sort.Strings(list)
	if len(list) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT uuid::text, coalesce(host,''), deleted_at IS NOT NULL OR coalesce(vm_state,'') = 'deleted', vgpus
		FROM instances WHERE uuid = ANY($1::uuid[])`, list)
	if err != nil {
		return fmt.Errorf("read instances: %w", err)
	}
	for rows.Next() {
		var id string
		in := InstanceView{Known: true}
		if err := rows.Scan(&id, &in.Host, &in.Deleted, &in.VGPUs); err != nil {
			rows.Close()
			return err
		}
		s.Instances[id] = in
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	// Moves of a running maintenance operation (bridge/maintenance): the
	// bridge's reservation consumers and Nova's migrations it started.
	rows, err = tx.Query(ctx, `SELECT reservation_consumer::text, true FROM maintenance_vms
			WHERE state NOT IN ('done','failed') AND reservation_consumer = ANY($1::uuid[])
		UNION ALL SELECT migration_uuid::text, false FROM maintenance_vms
			WHERE state NOT IN ('done','failed') AND migration_uuid = ANY($1::uuid[])`, list)
	if err != nil {
		return fmt.Errorf("read the moves of maintenance operations: %w", err)
	}
	for rows.Next() {
		var c string
		var resv bool
		if err := rows.Scan(&c, &resv); err != nil {
			rows.Close()
			return err
		}
		if s.Transient == nil {
			s.Transient = map[string]string{}
		}
		s.Transient[c] = TransientMigration
		if resv {
			s.Transient[c] = TransientReservation
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, `SELECT DISTINCT instance_uuid::text, provider_uuid::text FROM vgpu_attachments
		WHERE provider_uuid IS NOT NULL AND instance_uuid = ANY($1::uuid[])`, list)
	if err != nil {
		return fmt.Errorf("read the bridge's claims: %w", err)
	}
	for rows.Next() {
		var c, p string
		if err := rows.Scan(&c, &p); err != nil {
			rows.Close()
			return err
		}
		s.Made[c+"|"+p] = true
	}
	rows.Close()
	return rows.Err()
}

// readTransient asks Placement the consumer type of every consumer that
// holds vGPU units and is no instance the bridge knows, and records Nova's
// migration consumers and the bridge's reservations in s.Transient. A
// consumer that cannot be read is judged as before (reported unknown).
func (r *Reconciler) readTransient(ctx context.Context, s *Snapshot) {
	ct, ok := r.d.Placement.(ConsumerTyper)
	if !ok {
		return
	}
	if s.Transient == nil {
		s.Transient = map[string]string{}
	}
	asked := map[string]bool{}
	for c := range s.Transient {
		asked[c] = true // known from a maintenance operation
	}
	for _, cons := range s.Allocations {
		for c, n := range cons {
			if n == 0 || asked[c] || s.instance(c).Known {
				continue
			}
			asked[c] = true
			t, err := ct.ConsumerType(ctx, c)
			if err != nil {
				r.log.Warn("drift: cannot read a consumer's type", logkey.Consumer, c, logkey.Err, err)
				continue
			}
			switch t {
			case ConsumerTypeMigration:
				s.Transient[c] = TransientMigration
			case placement.ReservationConsumerType:
				s.Transient[c] = TransientReservation
			}
		}
	}
}

// ConsumerTypeMigration is the Placement consumer type Nova (2023.1+)
// gives its migration consumers.
const ConsumerTypeMigration = "MIGRATION"

// readAllocations asks Placement who holds what on every GPU provider.
func (r *Reconciler) readAllocations(ctx context.Context, s *Snapshot) error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, r.cfg.Concurrency)
	var firstErr error
	failed := 0
	novaVF, _ := r.d.Placement.(NovaVFClasses)
	for _, g := range s.GPUs {
		if novaVF != nil && novaVF.IsNovaVF(g.Class) {
			continue // Nova's PCI claims: neither the bridge's nor a vGPU flavor's
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			al, err := r.d.Placement.ProviderAllocations(ctx, g.Provider)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				s.Unread[g.Provider] = true
				failed++
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			cons := map[string]int{}
			for c, res := range al {
				if n := res[g.Class]; n > 0 {
					cons[c] = n
				}
			}
			s.Allocations[g.Provider] = cons
		}()
	}
	wg.Wait()
	if failed > 0 {
		if failed == len(s.GPUs) {
			return fmt.Errorf("placement: no GPU provider's allocations could be read: %w", firstErr)
		}
		r.log.Warn("drift: some GPU providers' allocations could not be read; they are not judged this run", "providers", failed, logkey.Err, firstErr)
	}
	return nil
}

// open is a finding kept from an earlier run.
type open struct {
	id        int64
	kind      string
	host      string
	firstSeen time.Time
	repaired  bool
	request   *uuid.UUID
}

// persist writes the run's findings, resolves the ones gone, and repairs.
// It reports whether repair commands were queued.
func (r *Reconciler) persist(ctx context.Context, tx pgx.Tx, found []Finding, skipped []string, res *RunResult, releases *[]release) (bool, error) {
	now := time.Now()
	prev := map[string]*open{}
	rows, err := tx.Query(ctx, `SELECT id, fingerprint, kind, coalesce(host,''), first_seen, repaired, repair_request_id
		FROM drift_findings WHERE resolved_at IS NULL FOR UPDATE`)
	if err != nil {
		return false, fmt.Errorf("read findings: %w", err)
	}
	for rows.Next() {
		o := &open{}
		var fp string
		if err := rows.Scan(&o.id, &fp, &o.kind, &o.host, &o.firstSeen, &o.repaired, &o.request); err != nil {
			rows.Close()
			return false, err
		}
		prev[fp] = o
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	// Repairs queued earlier that have finished.
	for _, o := range prev {
		if o.request == nil || o.repaired {
			continue
		}
		var st string
		if err := tx.QueryRow(ctx, `SELECT state FROM requests WHERE id = $1`, *o.request).Scan(&st); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			return false, err
		}
		if requests.State(st) == requests.Succeeded {
			if _, err := tx.Exec(ctx, `UPDATE drift_findings SET repaired = true, repaired_at = now() WHERE id = $1`, o.id); err != nil {
				return false, err
			}
			o.repaired = true
			r.m.repairs.WithLabelValues(o.kind, "succeeded").Inc()
		}
	}

	seen := map[string]bool{}
	kick := false
	held := r.cfg.Repair && r.d.Hold != nil && r.d.Hold(ctx)
	if held {
		r.log.Info("drift: repairs held (the bridge is paused or observe-only)")
	}
	for _, f := range found {
		fp := f.Fingerprint()
		seen[fp] = true
		o, ok := prev[fp]
		if ok {
			if _, err := tx.Exec(ctx, `UPDATE drift_findings SET last_seen = now(), seen = seen + 1, detail = $2, repairable = $3 WHERE id = $1`,
				o.id, f.Detail, f.Repairable); err != nil {
				return false, err
			}
		} else {
			o = &open{kind: string(f.Kind), host: f.Host, firstSeen: now}
			if err := tx.QueryRow(ctx, `INSERT INTO drift_findings (kind, fingerprint, host, provider_uuid, pci_address, instance_uuid, mdev_uuid, detail, repairable)
				VALUES ($1, $2, nullif($3,''), nullif($4,'')::uuid, nullif($5,''), nullif($6,'')::uuid, nullif($7,'')::uuid, $8, $9) RETURNING id, first_seen`,
				string(f.Kind), fp, f.Host, uuidOrEmpty(f.Provider), f.PCI, uuidOrEmpty(f.Instance), uuidOrEmpty(f.Mdev), f.Detail, f.Repairable).
				Scan(&o.id, &o.firstSeen); err != nil {
				return false, fmt.Errorf("record finding %s: %w", fp, err)
			}
			if err := r.audit(ctx, tx, "drift_found", o.id, "", map[string]any{"kind": f.Kind, "host": f.Host, "provider_uuid": f.Provider,
				"pci_address": f.PCI, "instance_uuid": f.Instance, "mdev_uuid": f.Mdev, "detail": f.Detail, "repairable": f.Repairable}); err != nil {
				return false, err
			}
			res.New++
			r.m.found.WithLabelValues(string(f.Kind)).Inc()
			r.log.Warn("drift: new finding", logkey.Kind, f.Kind, logkey.Host, f.Host, logkey.Provider, f.Provider, logkey.Instance, f.Instance,
				logkey.Mdev, f.Mdev, "repairable", f.Repairable, logkey.Detail, f.Detail)
		}
		res.Findings++
		if !r.cfg.Repair || !f.Repairable || f.Repair == nil || o.repaired || now.Sub(o.firstSeen) < r.cfg.RepairGrace || held {
			continue
		}
		queued, err := r.repair(ctx, tx, f, o, releases)
		if err != nil {
			return false, err
		}
		if queued {
			res.Repairs++
			kick = kick || f.Repair.RemoveMdev
		}
	}
	skip := map[string]bool{}
	for _, h := range skipped {
		skip[h] = true
	}
	for fp, o := range prev {
		if seen[fp] || (o.host != "" && skip[o.host] && (o.kind == string(OrphanMdev) || o.kind == string(MissingDevice) || o.kind == string(UnknownInstance))) {
			continue
		}
		if _, err := tx.Exec(ctx, `UPDATE drift_findings SET resolved_at = now() WHERE id = $1`, o.id); err != nil {
			return false, err
		}
		if err := r.audit(ctx, tx, "drift_resolved", o.id, "", map[string]any{"kind": o.kind, "host": o.host, "repaired": o.repaired}); err != nil {
			return false, err
		}
		res.Resolved++
		r.log.Info("drift: finding resolved", logkey.Kind, o.kind, logkey.Host, o.host, "finding", o.id, "repaired", o.repaired)
	}
	return kick, nil
}

// repair fixes one finding; it reports whether something was done. A
// claim to give back in Placement goes to releases instead: it is
// released, then recorded, after the transaction (runLocked).
func (r *Reconciler) repair(ctx context.Context, tx pgx.Tx, f Finding, o *open, releases *[]release) (bool, error) {
	rp := f.Repair
	switch {
	case rp.RemoveMdev:
		if o.request != nil {
			var st string
			err := tx.QueryRow(ctx, `SELECT state FROM requests WHERE id = $1`, *o.request).Scan(&st)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return false, err
			}
			if err == nil && !requests.State(st).Final() {
				return false, nil // the earlier repair is in flight
			}
		}
		now := time.Now()
		reqID := uuid.New()
		var inst *uuid.UUID
		if u, err := uuid.Parse(f.Instance); err == nil {
			inst = &u
		}
		body, _ := json.Marshal(map[string]any{"finding_id": o.id, "kind": f.Kind, "host": f.Host, "mdev_uuid": f.Mdev, "pci_address": f.PCI})
		if err := r.d.Requests.Create(ctx, tx, requests.Request{ID: reqID, Source: Source, Kind: "drift." + string(f.Kind), InstanceUUID: inst, Body: body}); err != nil {
			return false, err
		}
		cmd := protocol.Command{V: protocol.Version, Minor: protocol.Minor, ID: uuid.NewString(), Kind: protocol.RemoveMdev, Host: f.Host, RequestID: reqID.String(),
			IssuedAt: now.UTC(), ExpiresAt: now.Add(r.cfg.CommandTimeout).UTC()}
		if err := cmd.MarshalParams(protocol.MdevParams{MdevUUID: f.Mdev, ParentPCI: f.PCI, VendorVFIO: rp.VF}); err != nil {
			return false, err
		}
		if err := cmd.Validate(); err != nil {
			return false, err
		}
		cb, err := json.Marshal(cmd)
		if err != nil {
			return false, err
		}
		if err := requests.QueueCommands(ctx, tx, reqID, requests.PurposeAction, []requests.Command{{ID: cmd.ID, Host: cmd.Host,
			Kind: string(cmd.Kind), Body: cb, ExpiresAt: cmd.ExpiresAt, Seq: 1}}); err != nil {
			return false, err
		}
		if err := requests.SetDeadline(ctx, tx, reqID, cmd.ExpiresAt); err != nil {
			return false, err
		}
		what := fmt.Sprintf("remove_mdev %s queued on host %s (command %s)", f.Mdev, f.Host, cmd.ID)
		if rp.VF {
			what = fmt.Sprintf("remove_mdev of VF %s (its type cleared) queued on host %s (command %s)", f.PCI, f.Host, cmd.ID)
		}
		if _, err := r.d.Requests.Transition(ctx, tx, reqID, requests.Decided, "queued", what, ""); err != nil {
			return false, err
		}
		if _, err := tx.Exec(ctx, `UPDATE drift_findings SET repair = $2, repair_request_id = $3 WHERE id = $1`, o.id, what, reqID); err != nil {
			return false, err
		}
		o.request = &reqID
		r.m.repairs.WithLabelValues(string(f.Kind), "queued").Inc()
		r.log.Info("drift: repair queued", logkey.Kind, f.Kind, logkey.Host, f.Host, logkey.Mdev, f.Mdev, logkey.RequestID, reqID)
		return true, r.audit(ctx, tx, "drift_repair", o.id, reqID.String(), map[string]any{"kind": f.Kind, "repair": what, "command_id": cmd.ID})
	case rp.Release:
		if rp.Amount > 0 {
			*releases = append(*releases, release{f: f, o: o})
			return false, nil
		}
		return r.recordRelease(ctx, tx, f, o, "")
	}
	return false, nil
}

// recordRelease records the repair of a stale claim: released says what
// was given back in Placement ("" when nothing was held), and the
// finding's vGPU records are marked released.
func (r *Reconciler) recordRelease(ctx context.Context, tx pgx.Tx, f Finding, o *open, released string) (bool, error) {
	rp := f.Repair
	var parts []string
	if released != "" {
		parts = append(parts, released)
	}
	if len(rp.Attachments) > 0 {
		if err := requests.ReleaseStale(ctx, tx, rp.Attachments, "drift reconciler: the instance is gone or the claim is stale"); err != nil {
			return false, err
		}
		parts = append(parts, fmt.Sprintf("%d vGPU record(s) marked released (their mdevs are removed as orphans)", len(rp.Attachments)))
	}
	what := joinSemi(parts)
	if what == "" {
		return false, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE drift_findings SET repair = $2, repaired = true, repaired_at = now() WHERE id = $1`, o.id, what); err != nil {
		return false, err
	}
	o.repaired = true
	r.m.repairs.WithLabelValues(string(f.Kind), "succeeded").Inc()
	r.log.Info("drift: repaired", logkey.Kind, f.Kind, logkey.Instance, rp.Consumer, logkey.Provider, f.Provider, "repair", what)
	return true, r.audit(ctx, tx, "drift_repair", o.id, "", map[string]any{"kind": f.Kind, "repair": what})
}

func (r *Reconciler) audit(ctx context.Context, tx pgx.Tx, action string, id int64, req string, detail map[string]any) error {
	d, _ := json.Marshal(detail)
	return requests.Audit(ctx, tx, requests.Entry{Actor: "vgpu-bridge/" + r.cfg.Replica, Action: action, ObjectType: "drift_finding",
		ObjectID: fmt.Sprint(id), RequestID: req, Detail: d})
}

func (r *Reconciler) refreshGauge(ctx context.Context) error {
	rows, err := r.d.Pool.Query(ctx, `SELECT kind, count(*) FROM drift_findings WHERE resolved_at IS NULL GROUP BY kind`)
	if err != nil {
		return err
	}
	defer rows.Close()
	counts := map[string]float64{}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return err
		}
		counts[k] = float64(n)
	}
	for _, k := range Kinds {
		r.m.open.WithLabelValues(string(k)).Set(counts[string(k)])
	}
	return rows.Err()
}

func uuidOrEmpty(s string) string {
	if protocol.ValidUUID(s) {
		return s
	}
	return ""
}

func joinSemi(parts []string) string {
	out := ""
	for i, p := range parts {
		if i > 0 {
			out += "; "
		}
		out += p
	}
	return out
}
