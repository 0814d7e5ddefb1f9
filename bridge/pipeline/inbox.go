package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

type candidate struct {
	id       int64
	instance string
	project  string // "" for an event of no known project
	source   string
	kind     string // the event's type
}

// inboxBatch reads the inbox's next events, at most $1: the projects that
// have ready events, the one with the oldest first (at most $1 of them),
// and of each its first ready events after id $4[i] (0 when the project
// is not in $3), at most $5[i] (or $2) of them; the first event of each
// project, then the second, and so on. ProcessOnce passes, per project, the last
// event it queued and the room left in the project's share, so a look
// reads only what is new. Events of no known project count as the project
// "". The projects are walked on events_unprocessed_project_idx, one probe
// each, so the cost does not grow with a backlog.
const inboxBatch = `WITH RECURSIVE projects(k) AS (
		(SELECT coalesce(project_id, '') FROM events WHERE processed_at IS NULL ORDER BY coalesce(project_id, '') LIMIT 1)
		UNION ALL
		SELECT (SELECT coalesce(project_id, '') FROM events
			WHERE processed_at IS NULL AND coalesce(project_id, '') > projects.k ORDER BY coalesce(project_id, '') LIMIT 1)
		FROM projects WHERE projects.k IS NOT NULL
	), heads AS (
		SELECT projects.k, h.id AS head FROM projects CROSS JOIN LATERAL (
			SELECT id FROM events WHERE processed_at IS NULL AND coalesce(project_id, '') = projects.k
				AND (not_before IS NULL OR not_before <= now())
			ORDER BY id LIMIT 1) h
		WHERE projects.k IS NOT NULL
		ORDER BY h.id LIMIT $1
	), queued AS (
		SELECT * FROM unnest($3::text[], $4::bigint[], $5::int[]) AS q(k, after, room)
	)
	SELECT heads.k, e.id, e.inst, e.source, e.event_type FROM heads LEFT JOIN queued ON queued.k = heads.k CROSS JOIN LATERAL (
		SELECT id, coalesce(instance_uuid::text, '') AS inst, source, event_type FROM events
		WHERE processed_at IS NULL AND coalesce(project_id, '') = heads.k AND (not_before IS NULL OR not_before <= now())
			AND id > coalesce(queued.after, 0)
		ORDER BY id LIMIT coalesce(queued.room, $2)) e
	ORDER BY row_number() OVER (PARTITION BY heads.k ORDER BY e.id), heads.head
	LIMIT $1`

// minRepoll and maxRepoll bound the least time between two looks at the
// inbox that a wake (a commit) asks for while events are being decided:
// ten times what the last look took, so that a slow look (thousands of
// projects with a backlog) is not run back to back. A look because the
// queue runs low is not held back.
const (
	minRepoll = 5 * time.Millisecond
	maxRepoll = 20 * time.Millisecond
)

// ProcessOnce decides the inbox's events until none is ready; it returns
// how many events it closed. Its workers take the projects' events in
// turns (one of each project with events queued, then the next), events
// of one instance one at a time and in order. It looks at the inbox
// (inboxBatch) again when its queue runs low and, while deciding, when a
// commit wakes it, so that an event of another project joins the turns
// within milliseconds instead of waiting behind a backlog; a look that
// took all it found is not repeated until a commit wakes it (events that
// become ready by time wait for Run's next poll). At most
// ProjectShare events of a project are queued or being decided at a time
// (a full look, once a second, may add the project's older events that
// became ready again), so no more than that many of one project's events
// go ahead of another project's event once a look found it.
func (p *Processor) ProcessOnce(ctx context.Context) (int, error) {
	if p.paused(ctx, "pipeline") {
		return 0, nil // events wait in the inbox until resumed
	}
	s := newTurns(min(p.cfg.ProjectShare, p.cfg.BatchSize))
	took, err := p.poll(ctx, s)
	if err != nil || s.queued == 0 {
		return 0, err
	}
	type outcome struct {
		c   candidate
		ok  bool
		err error
	}
	work := make(chan candidate)
	results := make(chan outcome)
	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Go(func() {
			for c := range work {
				ok, err := p.processOne(ctx, c)
				results <- outcome{c, ok, err}
			}
		})
	}
	defer func() { close(work); wg.Wait() }()
	n, inflight := 0, 0
	lastPoll := time.Now()
	woken := false
	for {
		for inflight < p.cfg.Workers && ctx.Err() == nil {
			c, ok := s.next()
			if !ok {
				break
			}
			inflight++
			work <- c
		}
		if inflight == 0 {
			if ctx.Err() != nil {
				return n, nil
			}
			if !woken && !s.more {
				// Nothing committed since the last look (a commit wakes
				// the processor: a wake not taken here makes Run look
				// again at once), and that look took all it found.
				return n, nil
			}
			if took, err = p.poll(ctx, s); err != nil || s.queued == 0 {
				return n, err
			}
			lastPoll, woken = time.Now(), false
			continue
		}
		gap := min(max(minRepoll, 10*took), maxRepoll)
		var again <-chan time.Time
		var t *time.Timer
		if woken {
			t = time.NewTimer(time.Until(lastPoll.Add(gap)))
			again = t.C
		}
		select {
		case o := <-results:
			inflight--
			s.finished(o.c, o.ok && o.err == nil)
			switch {
			case o.err != nil:
				p.log.Warn("pipeline: event not processed", logkey.Event, o.c.id, logkey.Err, o.err)
				s.drop(o.c.instance) // keep the instance's order: the rest waits
			case !o.ok:
				s.drop(o.c.instance)
			default:
				n++
			}
		case <-p.wake.C():
			woken = true
		case <-again:
		}
		if t != nil {
			t.Stop()
		}
		// The queue runs low: a look, unless nothing was committed since
		// the last one and it took all it found (it would find nothing).
		low := s.queued < p.cfg.Workers && (woken || s.more)
		if ctx.Err() == nil && (low || woken && time.Since(lastPoll) >= gap) {
			if took, err = p.poll(ctx, s); err != nil {
				p.log.Warn("pipeline: inbox poll failed", logkey.Err, err)
			}
			lastPoll, woken = time.Now(), false
		}
	}
}

// poll queues the inbox's next events (inboxBatch) and returns how long
// the look took.
func (p *Processor) poll(ctx context.Context, s *turns) (time.Duration, error) {
	start := time.Now()
	// Now and then a look from each project's first event: events before
	// the last one queued that became ready since (a retry's backoff
	// ended) are not left for the next call, which a steady stream of
	// events may hold off for long;
	full := time.Since(s.lastFull) >= fullLook
	if full {
		// and the events given up on may be taken again.
		s.lastFull = start
		for id := range s.dropped {
			delete(s.seen, id)
		}
		clear(s.dropped)
	}
	var ks []string
	var after []int64
	var room []int32
	for k, st := range s.projects {
		last, r := st.last, max(s.share-st.held, 0)
		if full {
			last, r = 0, s.share // the project's first share of events, queued ones included
		}
		ks, after, room = append(ks, k), append(after, last), append(room, int32(r))
	}
	limit := make(map[string]int, len(ks))
	for i, k := range ks {
		limit[k] = int(room[i])
	}
	// Until the look answered in full: more may be waiting.
	s.more = true
	rows, err := p.d.Pool.Query(ctx, inboxBatch, p.cfg.BatchSize, s.share, ks, after, room)
	if err != nil {
		return time.Since(start), fmt.Errorf("poll inbox: %w", err)
	}
	defer rows.Close()
	got := map[string]int{}
	total := 0
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.project, &c.id, &c.instance, &c.source, &c.kind); err != nil {
			return time.Since(start), err
		}
		got[c.project]++
		total++
		s.add(c)
	}
	if err := rows.Err(); err != nil {
		return time.Since(start), err
	}
	// A look cut short by its limits (the batch, a project's room) left
	// events behind.
	more := total >= p.cfg.BatchSize
	for k, n := range got {
		l, ok := limit[k]
		if !ok {
			l = s.share
		}
		more = more || n >= l
	}
	for _, l := range limit {
		more = more || l == 0 // a project with no room: its next events were not asked for
	}
	s.more = more
	return time.Since(start), nil
}

// turns is what ProcessOnce has queued, by project: the projects take
// turns, each giving its oldest queued event whose instance is not being
// decided.
type turns struct {
	share    int
	order    []string // projects with events queued, in turn order
	queues   map[string][]candidate
	turn     int                      // index in order of the project whose turn is next
	projects map[string]*projectState // every project met in this call
	seen     map[int64]bool           // queued, being decided, or given up on in this call
	dropped  map[int64]bool           // given up on since the last full look
	busy     map[string]bool          // instances being decided
	queued   int
	lastFull time.Time // the last look from each project's first event
	more     bool      // the last look may have left ready events behind (its limits)
}

// fullLook is how often a look starts from each project's first ready
// event rather than after the last one queued.
const fullLook = time.Second

type projectState struct {
	last int64 // the last event queued
	held int   // events queued or being decided
}

func newTurns(share int) *turns {
	return &turns{share: share, queues: map[string][]candidate{}, projects: map[string]*projectState{},
		seen: map[int64]bool{}, dropped: map[int64]bool{}, busy: map[string]bool{}, lastFull: time.Now()}
}

func (s *turns) add(c candidate) {
	if s.seen[c.id] {
		return
	}
	s.seen[c.id] = true
	st := s.projects[c.project]
	if st == nil {
		st = &projectState{}
		s.projects[c.project] = st
	}
	st.last, st.held = max(st.last, c.id), st.held+1
	if _, ok := s.queues[c.project]; !ok {
		s.order = append(s.order, c.project)
	}
	s.queues[c.project] = append(s.queues[c.project], c)
	s.queued++
}

// next takes the next event to decide, or false when every queued event's
// instance is being decided (or none is queued).
func (s *turns) next() (candidate, bool) {
	for range len(s.order) {
		if s.turn >= len(s.order) {
			s.turn = 0
		}
		proj := s.order[s.turn]
		q := s.queues[proj]
		for i, c := range q {
			if c.instance != "" && s.busy[c.instance] {
				continue
			}
			if c.instance != "" {
				s.busy[c.instance] = true
			}
			s.queues[proj] = append(q[:i:i], q[i+1:]...)
			s.queued--
			if len(s.queues[proj]) == 0 {
				s.remove(s.turn)
			} else {
				s.turn++
			}
			return c, true
		}
		s.turn++
	}
	return candidate{}, false
}

// remove takes the project at i out of the turns.
func (s *turns) remove(i int) {
	delete(s.queues, s.order[i])
	s.order = slices.Delete(s.order, i, i+1)
}

// finished records that c is no longer being decided; closed: it was,
// else it is given up on until the next full look.
func (s *turns) finished(c candidate, closed bool) {
	delete(s.busy, c.instance)
	s.projects[c.project].held--
	if closed {
		delete(s.seen, c.id) // no look returns it again
	} else {
		s.dropped[c.id] = true
	}
}

// drop gives up on the queued events of instance until the next full
// look: an earlier one was not decided, and its later ones wait.
func (s *turns) drop(instance string) {
	if instance == "" {
		return
	}
	for i := 0; i < len(s.order); {
		proj := s.order[i]
		q := slices.DeleteFunc(s.queues[proj], func(c candidate) bool {
			if c.instance == instance {
				s.dropped[c.id] = true
				return true
			}
			return false
		})
		gone := len(s.queues[proj]) - len(q)
		s.queued -= gone
		s.projects[proj].held -= gone
		s.queues[proj] = q
		if len(q) == 0 {
			s.remove(i)
			if s.turn > i {
				s.turn--
			}
			continue
		}
		i++
	}
}
