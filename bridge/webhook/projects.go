package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

// CodeRateLimitedProject is the code of the 429 answered when the project
// of a request's instance has used up its bucket (Config.ProjectRate).
const CodeRateLimitedProject = "rate_limited_project"

// projectOf remembers the project of each instance. An instance's project
// never changes, so what is known is kept (up to maxInstances, then
// forgotten all at once); that the bridge does not know an instance is
// kept for unknownTTL only, so that its first Nova notification is seen
// soon after. On the accept path, an instance seen before costs no query;
// the others cost one query per request (all its instances at once).
type projectOf struct {
	pool *pgxpool.Pool
	now  func() time.Time

	mu    sync.Mutex
	known map[uuid.UUID]string
	// unknown: when each instance the bridge did not know was looked up.
	unknown map[uuid.UUID]time.Time
}

const (
	maxInstances = 200000
	unknownTTL   = 5 * time.Second
)

func newProjectOf(pool *pgxpool.Pool, now func() time.Time) *projectOf {
	return &projectOf{pool: pool, now: now, known: map[uuid.UUID]string{}, unknown: map[uuid.UUID]time.Time{}}
}

// cached returns what is remembered of id: its project (known), or that
// the bridge did not know it a moment ago (fresh), or neither. c.mu held.
func (c *projectOf) cached(id uuid.UUID, now time.Time) (project string, known, fresh bool) {
	if p, ok := c.known[id]; ok {
		return p, true, false
	}
	at, ok := c.unknown[id]
	return "", false, ok && now.Sub(at) <= unknownTTL && !now.Before(at)
}

// fetch reads the projects of ids, which the cache does not hold, and
// remembers them ("" for an instance the bridge knows without a project).
func (c *projectOf) fetch(ctx context.Context, ids []uuid.UUID, now time.Time) (map[uuid.UUID]string, error) {
	out := make(map[uuid.UUID]string, len(ids))
	rows, err := c.pool.Query(ctx, `SELECT uuid, coalesce(project_id, '') FROM instances WHERE uuid = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var p string
		if err := rows.Scan(&id, &p); err != nil {
			return nil, err
		}
		out[id] = p
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.known)+len(ids) > maxInstances {
		clear(c.known)
	}
	if len(c.unknown)+len(ids) > maxInstances {
		clear(c.unknown)
	}
	for _, id := range ids {
		if p, ok := out[id]; ok {
			c.known[id] = p
			delete(c.unknown, id)
		} else {
			c.unknown[id] = now
		}
	}
	return out, nil
}

// projectLimiters holds one token bucket per project, shared by every
// route that makes requests (POST /v1/webhooks/{source} of every source
// and POST /v1/requests): one project's flood is refused before it fills
// the inbox, whichever way it comes in.
type projectLimiters struct {
	rate  rate.Limit
	burst int
	now   func() time.Time

	mu       sync.Mutex
	projects map[string]*clientLimiter
}

// maxProjects bounds the buckets kept; idle ones (full again) are
// forgotten first.
const maxProjects = 100000

func newProjectLimiters(r float64, burst int, now func() time.Time) *projectLimiters {
	if r <= 0 {
		return nil // no limit
	}
	return &projectLimiters{rate: rate.Limit(r), burst: max(burst, 1), now: now, projects: map[string]*clientLimiter{}}
}

// allow takes one token from the bucket of each project; it takes none
// when one of them has none and returns how long to wait then. With
// always, it takes them all the same, into debt where a bucket has none:
// the request is accepted and the project's next ones wait the longer.
func (l *projectLimiters) allow(projects []string, always bool) (bool, time.Duration) {
	if l == nil || len(projects) == 0 {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	res := make([]*rate.Reservation, 0, len(projects))
	for _, p := range projects {
		b := l.projects[p]
		if b == nil {
			if len(l.projects) >= maxProjects {
				l.sweep(now)
			}
			b = &clientLimiter{lim: rate.NewLimiter(l.rate, l.burst)}
			l.projects[p] = b
		}
		b.seen = now
		r := b.lim.ReserveN(now, 1)
		if d := r.DelayFrom(now); !always && (!r.OK() || d > 0) {
			r.CancelAt(now)
			for _, taken := range res {
				taken.CancelAt(now)
			}
			return false, d
		}
		res = append(res, r)
	}
	return true, 0
}

// sweep forgets the buckets idle long enough to be full again, and when
// that is not enough, all of them (a full bucket is what a new one is).
func (l *projectLimiters) sweep(now time.Time) {
	refill := time.Duration(float64(l.burst)/float64(l.rate)*float64(time.Second)) + time.Second
	for p, b := range l.projects {
		if now.Sub(b.seen) > refill {
			delete(l.projects, p)
		}
	}
	if len(l.projects) >= maxProjects*3/4 {
		clear(l.projects)
	}
}

// projects looks up the projects of p's instances, writes them into its
// events (events.project_id, by which the pipeline shares its work between
// projects) and returns the distinct ones. Instances seen before cost no
// query; the others one query for all.
func (e *Endpoint) projects(ctx context.Context, p *pending) ([]string, error) {
	c := e.projectOf
	now := c.now()
	var miss []uuid.UUID
	c.mu.Lock()
	for i := range p.events {
		ev := &p.events[i]
		if ev.err != nil {
			continue
		}
		proj, known, fresh := c.cached(ev.vmUUID, now)
		switch {
		case known:
			ev.project = proj
		case !fresh:
			miss = append(miss, ev.vmUUID)
		}
	}
	c.mu.Unlock()
	if len(miss) > 0 {
		found, err := c.fetch(ctx, miss, now)
		if err != nil {
			return nil, err
		}
		for i := range p.events {
			if proj, ok := found[p.events[i].vmUUID]; ok && p.events[i].err == nil {
				p.events[i].project = proj
			}
		}
	}
	var out []string
	for _, ev := range p.events {
		if ev.project != "" && !slices.Contains(out, ev.project) {
			out = append(out, ev.project)
		}
	}
	return out, nil
}

// limitProjects takes a token of each project p acts on (the projects of
// its instances, as the bridge knows them); nil when there was one for
// each, else the 429 to answer. An instance the bridge does not know yet
// counts for no project. An Alertmanager message is never refused for it
// (Alertmanager does not retry a 429: its alerts would wait for the next
// repeat); it takes its tokens all the same.
func (e *Endpoint) limitProjects(ctx context.Context, p *pending) *api.ProblemDetails {
	projs, err := e.projects(ctx, p)
	if err != nil {
		e.log.Error("webhook: cannot read the instances' projects", "err", err)
		return storeUnavailable("checked")
	}
	if ok, wait := e.projectLim.allow(projs, p.src.cfg.Format == FormatAlertmanager); !ok {
		ra := min(retryAfter(wait), 3600)
		return &api.ProblemDetails{Status: http.StatusTooManyRequests, Title: "Too Many Requests", Code: CodeRateLimitedProject,
			Detail:  fmt.Sprintf("the instance's project has made too many requests; retry in %d s", ra),
			Headers: map[string]string{"Retry-After": strconv.Itoa(ra)}}
	}
	return nil
}
