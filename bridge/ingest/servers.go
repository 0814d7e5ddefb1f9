package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// The bridge learns instances from Nova's notifications, and also from
// Nova's API (ServerSync): every server at its first start, so that a
// cloud's instances are known from the day the bridge is installed, and
// then the servers changed since the last listing, so that notifications
// lost with a queue are caught up. A listed server is one more snapshot of
// the instance, ordered with the notifications by the time Nova last
// changed it (the server's "updated"), below every notification of that
// same time: a notification newer than the listing wins, and a listing
// never undoes one.

// ServerListEvent is the last_event_type of an instance row a listing of
// Nova's servers wrote.
const ServerListEvent = "nova-api:servers/detail"

// eventRank orders events of one time: a listed server below any
// notification (nova.Phase.Rank is 1 or more).
func eventRank(ev *Event) int {
	if ev.Message.EventType == ServerListEvent {
		return 0
	}
	return ev.Message.Event.Phase.Rank()
}

// powerStates are the names the notifications give Nova's power state
// codes (nova/compute/power_state.py STATE_MAP), which the API lists.
var powerStates = map[int]string{0: "pending", 1: "running", 3: "paused", 4: "shutdown", 6: "crashed", 7: "suspended"}

// listedEvent makes a listed server a snapshot event, received at now
// (the skew tolerance bounds its time as it bounds a notification's).
func listedEvent(d computeapi.Detail, now time.Time, tolerance time.Duration) *Event {
	opt := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	in := nova.Instance{UUID: d.ID, TenantID: d.ProjectID, UserID: d.UserID, Host: opt(d.Host), Node: opt(d.Node),
		DisplayName: d.Name, AvailabilityZone: opt(d.AvailabilityZone), State: d.VMState, TaskState: opt(d.TaskState),
		PowerState: powerStates[d.PowerState]}
	if in.PowerState == "" {
		in.PowerState = "pending"
	}
	if !d.Created.IsZero() {
		in.CreatedAt = nova.Time{Time: d.Created}
	}
	if d.Deleted() {
		in.State = "deleted"
		in.DeletedAt = nova.Time{Time: d.Updated}
	}
	if d.Metadata != nil {
		in.Metadata = make(map[string]any, len(d.Metadata))
		for k, v := range d.Metadata {
			in.Metadata[k] = v
		}
	}
	if f := d.Flavor; f.Name != "" || f.VCPUs > 0 {
		// The server shows its flavor's copy (microversion 2.47+), without
		// the flavor's id.
		in.Flavor = &nova.Flavor{Name: f.Name, VCPUs: f.VCPUs, MemoryMB: f.RAM, RootGB: f.Disk, EphemeralGB: f.Ephemeral,
			Swap: f.Swap, ExtraSpecs: f.ExtraSpecs}
	}
	ev := &Event{Source: "nova", Message: &nova.Message{EventType: ServerListEvent}, Payload: &nova.InstanceUpdate{Instance: in},
		InstanceUUID: d.ID, ReceivedAt: now, Horizon: now.Add(tolerance)}
	ev.At = ev.bounded(d.Updated)
	return ev
}

// ApplyServers writes a page of listed servers to the instances they
// describe, in tx, as snapshots older than any notification of the same
// time; it returns how many instance rows it changed.
func ApplyServers(ctx context.Context, tx pgx.Tx, page []computeapi.Detail, now time.Time, tolerance time.Duration) (int, error) {
	evs := make([]*Event, 0, len(page))
	for _, d := range page {
		if d.Updated.IsZero() {
			return 0, fmt.Errorf("server %s: Nova listed it without its updated time", d.ID)
		}
		evs = append(evs, listedEvent(d, now, tolerance))
	}
	snaps, _ := foldSnapshots(evs)
	if _, err := applySnapshots(ctx, tx, snaps); err != nil {
		return 0, err
	}
	n := 0
	for _, ev := range evs {
		if ev.Applied {
			n++
		}
	}
	return n, nil
}

// ServerLister lists Nova's servers page by page (computeapi.Client).
type ServerLister interface {
	EachServerPage(ctx context.Context, o computeapi.ListServers, requestID string, fn func([]computeapi.Detail) error) error
}

// ServerSync lists Nova's servers into the instances: all of them when
// the bridge never did, then those changed since the last listing.
type ServerSync struct {
	Pool *pgxpool.Pool
	Nova ServerLister
	Log  *slog.Logger
	// Interval is the time between two listings; 0 lists once, at start.
	Interval time.Duration
	// Margin is taken off the last listing's start when asking Nova for
	// the changes since: Nova's clock and the bridge's differ.
	Margin time.Duration
	// ClockSkewTolerance bounds a listed server's time as it bounds a
	// notification's ([notifications] clock_skew_tolerance).
	ClockSkewTolerance time.Duration
	PageSize           int
	// Retry paces listings that failed.
	Retry backoff.Policy
}

// SyncResult is what one listing did.
type SyncResult struct {
	Full    bool // every server was listed (the first listing)
	Servers int  // servers Nova listed
	Changed int  // instance rows written
}

// Run lists at once, then every Interval, until ctx ends; a failed listing
// is tried again (Retry) and logged, never fatal.
func (s *ServerSync) Run(ctx context.Context) error {
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	failures := 0
	return wake.Loop(ctx, nil, func(ctx context.Context) (time.Duration, error) {
		r, err := s.Once(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil
			}
			failures++
			d := s.Retry.Delay(failures)
			log.Warn("nova server sync: listing failed; retrying", logkey.Err, err, logkey.Backoff, d)
			return d, nil
		}
		failures = 0
		log.Info("nova server sync: listed", logkey.Full, r.Full, "servers", r.Servers, logkey.Changed, r.Changed)
		if s.Interval <= 0 {
			<-ctx.Done()
		}
		return s.Interval, nil
	})
}

// Once lists Nova's servers once and records the listing. No transaction
// is open while Nova answers: each page is written in its own.
func (s *ServerSync) Once(ctx context.Context) (SyncResult, error) {
	var from *time.Time
	err := s.Pool.QueryRow(ctx, `SELECT listed_from FROM nova_server_sync`).Scan(&from)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return SyncResult{}, fmt.Errorf("read the last listing: %w", err)
	}
	var r SyncResult
	o := computeapi.ListServers{PageSize: s.PageSize}
	if from == nil {
		r.Full = true
	} else {
		o.ChangesSince = from.Add(-s.Margin)
	}
	var start time.Time
	if err := s.Pool.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
		return r, fmt.Errorf("read the database's clock: %w", err)
	}
	err = s.Nova.EachServerPage(ctx, o, "", func(page []computeapi.Detail) error {
		r.Servers += len(page)
		return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			// The listing's start bounds its servers' times, as a
			// notification's receipt bounds its own.
			n, err := ApplyServers(ctx, tx, page, start, s.ClockSkewTolerance)
			r.Changed += n
			return err
		})
	})
	if err != nil {
		return r, fmt.Errorf("list Nova's servers: %w", err)
	}
	_, err = s.Pool.Exec(ctx, `INSERT INTO nova_server_sync (listed_from, full_at, servers, changed) VALUES ($1, now(), $2, $3)
		ON CONFLICT (id) DO UPDATE SET listed_from = EXCLUDED.listed_from, servers = EXCLUDED.servers, changed = EXCLUDED.changed,
			updated_at = now()`, start, r.Servers, r.Changed)
	if err != nil {
		return r, fmt.Errorf("record the listing: %w", err)
	}
	return r, nil
}
