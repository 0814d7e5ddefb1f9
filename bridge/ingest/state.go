package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// Instance state from snapshot events (every InstanceActionPayload and
// InstanceUpdatePayload carries the whole instance) is written set-based:
// the batch's events are folded per instance in Go, then one INSERT for
// instances not yet known and one UPDATE for the others, each guarded so
// that state only moves forward in (notification timestamp, phase rank).
//
// Folding is exact: the columns of the snapshot come from the newest event,
// applied iff it is newer than the stored state; the sticky or optional
// columns (new_flavor, fault, deleted_at) take the newest event that set or
// cleared them, applied iff that event is newer than the stored state —
// which is what applying the events one by one would give.
//
// An event's time is Nova's timestamp bounded by the bridge's clock
// (Event.At): a host whose clock runs far ahead cannot make its event the
// newest for days. A delete is terminal whatever its time: a delete that
// is not newer than the state (a host whose clock runs behind another's)
// still sets deleted_at and vm_state 'deleted' (applyDeletes), and once
// vm_state is 'deleted' no event changes it again. Both rules give the
// same state folded as one by one.

// action is a fold of set/clear changes to one optional column.
type action struct {
	op   string // "", "set", "clear"
	val  []byte
	at   time.Time
	rank int
}

func (a *action) take(op string, val []byte, at time.Time, rank int) {
	a.op, a.val, a.at, a.rank = op, val, at, rank
}

// snapshot is the folded update of one instance.
type snapshot struct {
	uuid    string
	newest  *Event
	in      *nova.Instance
	at      time.Time
	rank    int
	flavor  *nova.Flavor // newest non-null flavor
	nf      action
	fault   action
	deleted action
	created *time.Time
	events  []*Event
	// deleteEv is the batch's first delete of the instance (isDelete), in
	// delivery order; deletedAt the time it gives.
	deleteEv  *Event
	deletedAt time.Time
}

// isDelete reports whether ev says the instance is gone: Nova's
// instance.delete.end, or any snapshot in vm_state deleted.
func isDelete(ev *Event, in *nova.Instance) bool {
	return ev.Message.EventType == "instance.delete.end" || in.State == "deleted"
}

// staleCopies are the notifications whose instance payload is a copy Nova's
// compute service held before another service changed the instance: they
// say what happened, never where the instance is or what it is doing, so
// they are recorded and passed on but change no instance state. Nova 26
// (nova/compute/manager.py):
//   - instance.live_migration_post.end: ComputeManager._post_live_migration
//     on the source sends it after its call to the destination's
//     post_live_migration_at_destination (which moved the instance and sent
//     live_migration_post_dest.end), from its own copy: host = the source,
//     task_state = migrating. The destination's post_dest.end is the end of
//     the move.
//   - instance.live_migration_rollback_dest.start/.end:
//     _rollback_live_migration on the source casts
//     rollback_live_migration_at_destination, so the destination's
//     notifications (task_state = migrating, the copy the cast carried) can
//     arrive after the source's live_migration_rollback.end, which clears
//     the task. A rollback does not move the instance either.
var staleCopies = map[string]bool{
	"instance.live_migration_post.end":            true,
	"instance.live_migration_rollback_dest.start": true,
	"instance.live_migration_rollback_dest.end":   true,
}

// snapshotOf is the instance state ev carries, when it carries one that
// state may be taken from.
func snapshotOf(ev *Event) (*nova.Instance, *nova.Flavor, bool) {
	if ev.Message != nil && staleCopies[ev.Message.EventType] {
		return nil, nil, false
	}
	in, nf, ok := instanceOf(ev.Payload)
	if ok && ev.Message != nil {
		in = evacuatedTo(ev.Message, in)
	}
	return in, nf, ok
}

// evacuatedTo is in as it is after the evacuation m ends, when m is one:
// Nova 26's instance.rebuild.end of an evacuation comes from the
// destination's compute service, but from the instance before its host
// changes there (ComputeManager._do_rebuild_instance sends it;
// rebuild_instance then sets host and node in
// ResourceTracker.finish_evacuation, bug 1896463, and nothing is sent
// after). So the publisher's host is where the instance is; its node is
// left unknown (nil), for the hosts table to give (the state statements).
// Any other event's instance is returned as it is.
func evacuatedTo(m *nova.Message, in *nova.Instance) *nova.Instance {
	if m.EventType != "instance.rebuild.end" || m.Service != "nova-compute" || m.Host == "" || in.Host == nil || *in.Host == "" || *in.Host == m.Host {
		return in
	}
	c := *in
	host := m.Host
	c.Host, c.Node = &host, nil
	return &c
}

func instanceOf(p nova.Payload) (*nova.Instance, *nova.Flavor, bool) {
	switch p := p.(type) {
	case *nova.InstanceAction:
		return &p.Instance, p.NewFlavor, true
	case *nova.InstanceUpdate:
		return &p.Instance, nil, true
	}
	return nil, nil, false
}

func newer(at time.Time, rank int, than time.Time, thanRank int) bool {
	return at.After(than) || at.Equal(than) && rank > thanRank
}

// foldSnapshots folds the snapshot events per instance, sorted by uuid.
// evs are in delivery order. Applied one by one, an event changes the state
// only when it is strictly newer than every event applied before it, so only
// the running maxima of each instance's events (in delivery order) count;
// the others are marked stale here.
func foldSnapshots(evs []*Event) (out []*snapshot, stale int) {
	by := map[string]*snapshot{}
	for _, ev := range evs {
		in, newFlavor, ok := snapshotOf(ev)
		if !ok {
			continue
		}
		m := ev.Message
		rank := eventRank(ev)
		at := ev.At
		s := by[in.UUID]
		if s == nil {
			s = &snapshot{uuid: in.UUID}
			by[in.UUID] = s
			out = append(out, s)
		}
		if s.deleteEv == nil && isDelete(ev, in) {
			s.deleteEv = ev
			s.deletedAt = at
			if d := in.DeletedAt.Ptr(); d != nil {
				s.deletedAt = ev.bounded(*d)
			}
		}
		if s.newest != nil && !newer(at, rank, s.at, s.rank) {
			stale++ // an event delivered earlier in the batch is as new
			continue
		}
		s.events = append(s.events, ev)
		s.newest, s.in, s.at, s.rank = ev, in, at, rank
		if in.Flavor != nil {
			s.flavor = in.Flavor
		}
		switch {
		case newFlavor != nil:
			v, _ := json.Marshal(newFlavor)
			s.nf.take("set", v, at, rank)
		case m.Event.Phase == nova.PhaseEnd && strings.HasPrefix(m.Event.Action, "resize") && m.Event.Action != "resize_prep":
			s.nf.take("clear", nil, at, rank)
		}
		switch {
		case in.Fault != nil:
			v, _ := json.Marshal(in.Fault)
			s.fault.take("set", v, at, rank)
		case rank == nova.PhaseEnd.Rank():
			s.fault.take("clear", nil, at, rank)
		}
		// deleted_at is set once by Nova; the newest event carrying it wins.
		if d := in.DeletedAt.Ptr(); d != nil {
			v, _ := json.Marshal(ev.bounded(*d))
			s.deleted.take("set", v, at, rank)
		} else if m.EventType == "instance.delete.end" {
			v, _ := json.Marshal(at)
			s.deleted.take("set", v, at, rank)
		}
		if c := in.CreatedAt.Ptr(); c != nil {
			if c := ev.bounded(*c); s.created == nil || c.Before(*s.created) {
				s.created = &c
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].uuid < out[j].uuid })
	return out, stale
}

// snapshotCols is the unnest column list shared by both statements.
const snapshotCols = `x(u, pj, us, h, nd, vs, tsk, ps, fl, dm, vg, dn, az,
		nfo, nfv, nfat, nfrk, fo, fv, fat, frk, dlo, dlv, dlat, dlrk, et, at, rk, mid, cr, gd)`

const snapshotUnnest = `unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
		$9::text[], $10::text[], $11::int[], $12::text[], $13::text[],
		$14::text[], $15::text[], $16::timestamptz[], $17::int[], $18::text[], $19::text[], $20::timestamptz[], $21::int[],
		$22::text[], $23::text[], $24::timestamptz[], $25::int[], $26::text[], $27::timestamptz[], $28::int[], $29::text[],
		$30::timestamptz[], $31::text[]) AS ` + snapshotCols

const insertSnapshots = `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, task_state, power_state,
		flavor, vgpu_demand, vgpus, display_name, availability_zone, new_flavor, fault,
		last_event_type, last_event_at, last_event_rank, last_message_id, deleted_at, created_at, updated_at, guest_driver)
	SELECT u::uuid, NULLIF(pj, ''), NULLIF(us, ''), h, COALESCE(nd, (SELECT node FROM hosts WHERE name = h)), NULLIF(vs, ''), tsk, NULLIF(ps, ''),
		fl::jsonb, dm::jsonb, vg, NULLIF(dn, ''), az,
		CASE WHEN nfo = 'set' THEN nfv::jsonb END, CASE WHEN fo = 'set' THEN fv::jsonb END,
		et, at, rk, mid, CASE WHEN dlo = 'set' THEN (dlv::jsonb #>> '{}')::timestamptz END, COALESCE(cr, now()), now(), NULLIF(gd, '')
	FROM ` + snapshotUnnest + `
	ON CONFLICT (uuid) DO NOTHING
	RETURNING uuid::text`

const updateSnapshots = `UPDATE instances AS i SET
		project_id = NULLIF(x.pj, ''), user_id = NULLIF(x.us, ''), host = x.h, node = COALESCE(x.nd, (SELECT hs.node FROM hosts hs WHERE hs.name = x.h)),
		vm_state = CASE WHEN i.vm_state = 'deleted' THEN i.vm_state ELSE NULLIF(x.vs, '') END,
		task_state = CASE WHEN i.vm_state = 'deleted' THEN NULL ELSE x.tsk END, power_state = NULLIF(x.ps, ''),
		flavor = COALESCE(x.fl::jsonb, i.flavor),
		vgpu_demand = CASE WHEN x.fl IS NULL THEN i.vgpu_demand ELSE x.dm::jsonb END,
		vgpus = CASE WHEN x.fl IS NULL THEN i.vgpus ELSE x.vg END,
		display_name = NULLIF(x.dn, ''), availability_zone = x.az,
		new_flavor = CASE WHEN x.nfo <> '' AND (i.last_event_at IS NULL OR (i.last_event_at, i.last_event_rank) < (x.nfat, x.nfrk))
			THEN x.nfv::jsonb ELSE i.new_flavor END,
		fault = CASE WHEN x.fo <> '' AND (i.last_event_at IS NULL OR (i.last_event_at, i.last_event_rank) < (x.fat, x.frk))
			THEN x.fv::jsonb ELSE i.fault END,
		deleted_at = COALESCE(i.deleted_at, CASE WHEN x.dlo = 'set' AND (i.last_event_at IS NULL OR (i.last_event_at, i.last_event_rank) < (x.dlat, x.dlrk))
			THEN (x.dlv::jsonb #>> '{}')::timestamptz END),
		created_at = LEAST(i.created_at, COALESCE(x.cr, i.created_at)),
		guest_driver = CASE WHEN x.gd IS NULL THEN i.guest_driver ELSE NULLIF(x.gd, '') END,
		last_event_type = x.et, last_event_at = x.at, last_event_rank = x.rk, last_message_id = x.mid,
		updated_at = now()
	FROM ` + snapshotUnnest + `
	WHERE i.uuid = x.u::uuid
		AND (i.last_event_at IS NULL OR (i.last_event_at, i.last_event_rank) < (x.at, x.rk))
	RETURNING i.uuid::text`

// applySnapshots writes the folded snapshots; it marks the events of
// updated instances Applied and returns how many events changed nothing.
//
// Most instances are known already, so the UPDATE runs first and the
// INSERT only for the instances it did not change. An INSERT that finds
// the row inserted meanwhile by a concurrent batch waits for that batch and
// does nothing; those rows get the UPDATE once more, which now sees them.
func applySnapshots(ctx context.Context, tx pgx.Tx, snaps []*snapshot) (stale int, err error) {
	if len(snaps) == 0 {
		return 0, nil
	}
	done := map[string]bool{}
	run := func(q string, snaps []*snapshot) error {
		rows, err := tx.Query(ctx, q, snapshotArgs(snaps)...)
		if err != nil {
			return fmt.Errorf("instance state: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			done[strings.ToLower(id)] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("instance state: %w", err)
		}
		return nil
	}
	left := func() []*snapshot {
		var out []*snapshot
		for _, s := range snaps {
			if !done[strings.ToLower(s.uuid)] {
				out = append(out, s)
			}
		}
		return out
	}
	if err := run(updateSnapshots, snaps); err != nil {
		return 0, err
	}
	if l := left(); len(l) > 0 {
		if err := run(insertSnapshots, l); err != nil {
			return 0, err
		}
		if l := left(); len(l) > 0 {
			if err := run(updateSnapshots, l); err != nil {
				return 0, err
			}
		}
	}
	for _, s := range snaps {
		ok := done[strings.ToLower(s.uuid)]
		for _, ev := range s.events {
			ev.Applied = ok
			if !ok {
				stale++
			}
		}
	}
	deleted, err := applyDeletes(ctx, tx, snaps)
	if err != nil {
		return 0, err
	}
	for _, s := range snaps {
		if ev := s.deleteEv; ev != nil && !ev.Applied && deleted[strings.ToLower(s.uuid)] {
			ev.Applied = true // counted stale above or by the fold
			stale--
		}
	}
	return stale, nil
}

// applyDeletes makes each instance a delete of the batch names deleted,
// whatever the delete's time: deleted_at (when not set yet), vm_state
// deleted, no task. A delete that was the newest event has done so
// already, and changes nothing here.
const applyDeletesSQL = `UPDATE instances AS i SET deleted_at = COALESCE(i.deleted_at, x.dl), vm_state = 'deleted', task_state = NULL,
		updated_at = now()
	FROM unnest($1::text[], $2::timestamptz[]) AS x(u, dl)
	WHERE i.uuid = x.u::uuid AND (i.deleted_at IS NULL OR i.vm_state IS DISTINCT FROM 'deleted' OR i.task_state IS NOT NULL)
	RETURNING i.uuid::text`

func applyDeletes(ctx context.Context, tx pgx.Tx, snaps []*snapshot) (map[string]bool, error) {
	var uuids []string
	var at []time.Time
	for _, s := range snaps {
		if s.deleteEv != nil {
			uuids, at = append(uuids, s.uuid), append(at, s.deletedAt)
		}
	}
	if len(uuids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, applyDeletesSQL, uuids, at)
	if err != nil {
		return nil, fmt.Errorf("instance deletes: %w", err)
	}
	done := map[string]bool{}
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { done[strings.ToLower(id)] = true; return nil }); err != nil {
		return nil, fmt.Errorf("instance deletes: %w", err)
	}
	return done, nil
}

// snapshotArgs are the arrays of insertSnapshots and updateSnapshots.
func snapshotArgs(snaps []*snapshot) []any {
	n := len(snaps)
	var (
		u, pj, us, vs, ps, dn, nfo, fo, dlo, et, mid = mk(n), mk(n), mk(n), mk(n), mk(n), mk(n), mk(n), mk(n), mk(n), mk(n), mk(n)
		h, nd, tsk, fl, dm, az, nfv, fv, dlv         = mkp(n), mkp(n), mkp(n), mkp(n), mkp(n), mkp(n), mkp(n), mkp(n), mkp(n)
		vg, nfrk, frk, dlrk, rk                      = make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n)
		nfat, fat, dlat, at                          = make([]time.Time, n), make([]time.Time, n), make([]time.Time, n), make([]time.Time, n)
		cr                                           = make([]*time.Time, n)
		gd                                           = mkp(n)
	)
	str := func(b []byte) *string {
		if b == nil {
			return nil
		}
		s := string(b)
		return &s
	}
	for i, s := range snaps {
		in, m := s.in, s.newest.Message
		u[i], pj[i], us[i], vs[i], ps[i], dn[i] = in.UUID, in.TenantID, in.UserID, in.State, in.PowerState, in.DisplayName
		h[i], nd[i], tsk[i], az[i] = in.Host, in.Node, in.TaskState, in.AvailabilityZone
		if s.flavor != nil {
			f, d, v := flavorJSON(s.flavor)
			fl[i], dm[i], vg[i] = str(f), str(d), int32(v)
		}
		nfo[i], nfv[i], nfat[i], nfrk[i] = s.nf.op, str(s.nf.val), s.nf.at, int32(s.nf.rank)
		fo[i], fv[i], fat[i], frk[i] = s.fault.op, str(s.fault.val), s.fault.at, int32(s.fault.rank)
		dlo[i], dlv[i], dlat[i], dlrk[i] = s.deleted.op, str(s.deleted.val), s.deleted.at, int32(s.deleted.rank)
		et[i], at[i], rk[i], mid[i] = m.EventType, s.at, int32(s.rank), m.MessageID
		cr[i] = s.created
		if v, known := in.DeclaredGuestDriver(); known {
			gd[i] = &v
		}
	}
	return []any{u, pj, us, h, nd, vs, tsk, ps, fl, dm, vg, dn, az, nfo, nfv, nfat, nfrk, fo, fv, fat, frk,
		dlo, dlv, dlat, dlrk, et, at, rk, mid, cr, gd}
}
