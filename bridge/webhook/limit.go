package webhook

import (
	"math"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// clientIP returns the address the request came from: the peer, or, when
// the peer is a trusted proxy, the nearest X-Forwarded-For hop that is not
// a trusted proxy.
func clientIP(remoteAddr string, xff []string, trusted []netip.Prefix) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(remoteAddr)
	var addr netip.Addr
	if err == nil {
		addr = ap.Addr().Unmap()
	} else if a, err := netip.ParseAddr(remoteAddr); err == nil {
		addr = a.Unmap()
	} else {
		return netip.Addr{}, false
	}
	if !inAny(trusted, addr) || len(xff) == 0 {
		return addr, true
	}
	var hops []string
	for _, h := range xff {
		hops = append(hops, strings.Split(h, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			// A hop we cannot read: the client is the last proxy that wrote one.
			return addr, true
		}
		addr = a.Unmap()
		if !inAny(trusted, addr) {
			return addr, true
		}
	}
	return addr, true
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// limiters holds a source's token bucket and one per client address.
type limiters struct {
	source      *rate.Limiter
	clientRate  rate.Limit
	clientBurst int
	maxClients  int

	mu      sync.Mutex
	clients map[netip.Addr]*clientLimiter
}

type clientLimiter struct {
	lim  *rate.Limiter
	seen time.Time
}

func newLimiters(r float64, burst int, cr float64, cburst, maxClients int) *limiters {
	return &limiters{
		source:      rate.NewLimiter(rate.Limit(r), burst),
		clientRate:  rate.Limit(cr),
		clientBurst: cburst,
		maxClients:  maxClients,
		clients:     make(map[netip.Addr]*clientLimiter),
	}
}

func (l *limiters) client(a netip.Addr, now time.Time) *rate.Limiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.clients[a]
	if c == nil {
		if len(l.clients) >= l.maxClients {
			l.sweep(now)
		}
		c = &clientLimiter{lim: rate.NewLimiter(l.clientRate, l.clientBurst)}
		l.clients[a] = c
	}
	c.seen = now
	return c.lim
}

// sweep forgets clients idle long enough for their bucket to be full
// again (forgetting them changes nothing); if that frees too little, it
// forgets the least recently seen half.
func (l *limiters) sweep(now time.Time) {
	refill := time.Minute
	if l.clientRate > 0 {
		refill = time.Duration(float64(l.clientBurst)/float64(l.clientRate)*float64(time.Second)) + time.Second
	}
	for a, c := range l.clients {
		if now.Sub(c.seen) > refill {
			delete(l.clients, a)
		}
	}
	if len(l.clients) < l.maxClients*3/4 {
		return
	}
	var times []time.Time
	for _, c := range l.clients {
		times = append(times, c.seen)
	}
	// The median of the last-seen times splits the map in two.
	cut := median(times)
	for a, c := range l.clients {
		if !c.seen.After(cut) {
			delete(l.clients, a)
		}
	}
}

func median(ts []time.Time) time.Time {
	if len(ts) == 0 {
		return time.Time{}
	}
	// Quickselect is overkill for a rare sweep; a partial sort is fine.
	lo, hi := ts[0], ts[0]
	for _, t := range ts {
		if t.Before(lo) {
			lo = t
		}
		if t.After(hi) {
			hi = t
		}
	}
	return lo.Add(hi.Sub(lo) / 2)
}

// allowClient takes a token from the client's bucket, before the request
// is authenticated. It returns "" when there was one, else the reason and
// how long to wait.
func (l *limiters) allowClient(a netip.Addr, now time.Time) (string, time.Duration) {
	rc := l.client(a, now).ReserveN(now, 1)
	if d := rc.DelayFrom(now); !rc.OK() || d > 0 {
		rc.CancelAt(now)
		return "rate_limited_client", d
	}
	return "", 0
}

// allowSource takes a token from the source's bucket, once the request is
// authenticated: unauthenticated requests never use up its budget.
func (l *limiters) allowSource(now time.Time) (string, time.Duration) {
	rs := l.source.ReserveN(now, 1)
	if d := rs.DelayFrom(now); !rs.OK() || d > 0 {
		rs.CancelAt(now)
		return "rate_limited_source", d
	}
	return "", 0
}

// retryAfter is the Retry-After value for a wait: whole seconds, at least 1.
func retryAfter(d time.Duration) int {
	s := int(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return s
}
