package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// A request may name a server the bridge has not heard of yet: one Nova
// created before the bridge started, before the first listing (or between
// two listings) and without a notification the bridge received. Lookup
// asks Nova for that one server on demand and stores it as a listing of
// Nova's servers stores it (ApplyServers: a snapshot ranked below every
// notification of the same time, its time bounded by the lookup's start),
// so that there is one way to store a server learnt from Nova's API.

// ServerGetter reads one server of Nova (computeapi.Client).
type ServerGetter interface {
	ServerDetail(ctx context.Context, id, requestID string) (computeapi.Detail, error)
}

// Outcomes of a lookup, the label of vgpu_bridge_nova_server_lookups_total.
const (
	LookupFound        = "found"         // Nova has the server; it is stored
	LookupAbsent       = "absent"        // Nova answered 404
	LookupRemembered   = "remembered"    // Nova answered 404 a short while ago: not asked again
	LookupOtherProject = "other_project" // Nova has the server, in another project than the caller's
	LookupError        = "error"         // Nova could not be asked (or the server not stored)
)

// LookupConfig bounds the lookups.
type LookupConfig struct {
	// AbsentTTL is how long a 404 is remembered: a request naming the same
	// id meanwhile is answered without asking Nova. 0 remembers nothing.
	AbsentTTL time.Duration
	// MaxRemembered bounds the ids remembered absent (default 10000).
	MaxRemembered int
	// Concurrency bounds the lookups in flight at once, all ids together
	// (default 4); one id has at most one in flight whatever this is.
	Concurrency int
	// ClockSkewTolerance bounds a looked-up server's time as it bounds a
	// notification's ([notifications] clock_skew_tolerance).
	ClockSkewTolerance time.Duration
}

// Lookup looks up, on demand, servers the bridge does not know. It is safe
// for concurrent use.
type Lookup struct {
	cfg   LookupConfig
	pool  *pgxpool.Pool
	nova  ServerGetter
	now   func() time.Time
	slots chan struct{}
	count *prometheus.CounterVec

	mu     sync.Mutex
	flight map[string]*lookupCall
	absent map[string]time.Time // id → until when Nova's 404 is remembered
}

type lookupCall struct {
	done    chan struct{}
	project string // the server's, when found
	err     error
}

// NewLookup makes a Lookup that stores into pool what nova answers; reg
// (may be nil) gets its counter.
func NewLookup(cfg LookupConfig, pool *pgxpool.Pool, nova ServerGetter, reg prometheus.Registerer) *Lookup {
	if cfg.MaxRemembered <= 0 {
		cfg.MaxRemembered = 10000
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	l := &Lookup{cfg: cfg, pool: pool, nova: nova, now: time.Now, slots: make(chan struct{}, cfg.Concurrency),
		flight: map[string]*lookupCall{}, absent: map[string]time.Time{},
		count: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_nova_server_lookups_total",
			Help: "Servers the bridge did not know, looked up in Nova's API (GET /servers/{id}) for a request naming them, by outcome: " +
				"found (stored), absent (Nova answered 404), remembered (a recent 404, Nova not asked again), " +
				"other_project (the server is in another project than the caller's), error (Nova could not be asked; the request's event is retried)."},
			[]string{"outcome"})}
	for _, o := range []string{LookupFound, LookupAbsent, LookupRemembered, LookupOtherProject, LookupError} {
		l.count.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(l.count)
	}
	return l
}

// ErrNoServer is what LookUp's callers get, wrapped, when Nova has no
// server of the id (or, for a project's caller, none in that project).
var ErrNoServer = errors.New("Nova has no such server")

// LookUp asks Nova for server id and stores it in the instances, with no
// transaction open while Nova answers. It reports true when Nova has the
// server, in project when project is not "" (the server is stored either
// way: it is a real server, and a listing would store it too); false when
// Nova answered 404 now or within AbsentTTL, or the server is another
// project's (the caller cannot tell the two apart). An error says Nova
// could not be asked, or the answer not stored: the caller tries again
// later. Concurrent calls for one id share one call to Nova.
func (l *Lookup) LookUp(ctx context.Context, id, project string) (bool, error) {
	l.mu.Lock()
	if until, ok := l.absent[id]; ok {
		if l.now().Before(until) {
			l.mu.Unlock()
			l.count.WithLabelValues(LookupRemembered).Inc()
			return false, nil
		}
		delete(l.absent, id)
	}
	c, shared := l.flight[id]
	if !shared {
		c = &lookupCall{done: make(chan struct{})}
		l.flight[id] = c
	}
	l.mu.Unlock()
	if !shared {
		c.project, c.err = l.call(ctx, id)
		l.mu.Lock()
		delete(l.flight, id)
		if errors.Is(c.err, ErrNoServer) && l.cfg.AbsentTTL > 0 {
			l.remember(id)
		}
		l.mu.Unlock()
		close(c.done)
	} else {
		select {
		case <-c.done:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	switch {
	case errors.Is(c.err, ErrNoServer):
		if !shared {
			l.count.WithLabelValues(LookupAbsent).Inc()
		}
		return false, nil
	case c.err != nil:
		if !shared {
			l.count.WithLabelValues(LookupError).Inc()
		}
		return false, c.err
	case project != "" && c.project != project:
		l.count.WithLabelValues(LookupOtherProject).Inc()
		return false, nil
	}
	if !shared {
		l.count.WithLabelValues(LookupFound).Inc()
	}
	return true, nil
}

// remember keeps id as absent for AbsentTTL, within MaxRemembered ids
// (the expired go first, then any). Called with mu held.
func (l *Lookup) remember(id string) {
	now := l.now()
	if len(l.absent) >= l.cfg.MaxRemembered {
		for k, until := range l.absent {
			if !now.Before(until) {
				delete(l.absent, k)
			}
		}
		for k := range l.absent {
			if len(l.absent) < l.cfg.MaxRemembered {
				break
			}
			delete(l.absent, k)
		}
	}
	l.absent[id] = now.Add(l.cfg.AbsentTTL)
}

// call asks Nova for id (within the concurrency bound) and stores the
// answer; it returns the server's project, or ErrNoServer.
func (l *Lookup) call(ctx context.Context, id string) (string, error) {
	select {
	case l.slots <- struct{}{}:
		defer func() { <-l.slots }()
	case <-ctx.Done():
		return "", ctx.Err()
	}
	// The lookup's start bounds the server's time, as a listing's start
	// bounds its servers' (ServerSync.Once): the database's clock.
	var start time.Time
	if err := l.pool.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
		return "", fmt.Errorf("read the database's clock: %w", err)
	}
	d, err := l.nova.ServerDetail(ctx, id, "")
	switch {
	case computeapi.IsNotFound(err):
		return "", fmt.Errorf("server %s: %w", id, ErrNoServer)
	case err != nil:
		return "", fmt.Errorf("look up server %s in Nova: %w", id, err)
	}
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		_, err := ApplyServers(ctx, tx, []computeapi.Detail{d}, start, l.cfg.ClockSkewTolerance)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("store server %s: %w", id, err)
	}
	if d.Deleted() {
		// GET /servers/{id} shows no deleted server (read_deleted "no");
		// should it show one, it is no server to act on, stored all the
		// same as a listing would.
		return "", fmt.Errorf("server %s is deleted: %w", id, ErrNoServer)
	}
	return d.ProjectID, nil
}
