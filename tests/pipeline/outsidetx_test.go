package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// outsideTx wraps the Placement that the pipeline and the drift reconciler
// call. At each call it asks the world's transaction watch (txWatch)
// whether the calling goroutine has a transaction open on a pool of the
// test: the mark of a Placement call made while its caller held a
// transaction open. Such calls fail the test when it ends, named with the
// statement the transaction ran last.
type outsideTx struct {
	t     *testing.T
	watch *txWatch
	p     pipeline.Placement
	d     drift.Placement
	svc   *placement.Service
	mu    *sync.Mutex
	bad   *[]string
	// claimErr, when set, is what every claim answers (Placement away).
	claimErr error
	// releaseDelay, when set, is how long every release waits before
	// Placement is asked (a slow Placement).
	releaseDelay time.Duration
}

func newOutsideTx(t *testing.T, watch *txWatch, svc *placement.Service) outsideTx {
	o := outsideTx{t: t, watch: watch, p: pipeline.ServiceAdapter{S: svc}, d: drift.ServiceAdapter{S: svc}, svc: svc, mu: &sync.Mutex{}, bad: &[]string{}}
	t.Cleanup(func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, b := range *o.bad {
			t.Errorf("a Placement call ran inside a transaction: %s", b)
		}
	})
	return o
}

func (o outsideTx) check(what string) {
	last, open := o.watch.open()
	if !open {
		return
	}
	o.mu.Lock()
	*o.bad = append(*o.bad, fmt.Sprintf("%s (open transaction, last statement: %.160s)", what, last))
	o.mu.Unlock()
}

// txWatch is a pgx tracer that knows, per goroutine, the transactions it
// has open on the connections of the pools it is installed on.
type txWatch struct {
	mu   sync.Mutex
	txs  map[uint64]map[*pgx.Conn]string // goroutine → connection in a transaction → its last statement
	last map[uint64]string
}

func newTxWatch() *txWatch {
	return &txWatch{txs: map[uint64]map[*pgx.Conn]string{}, last: map[uint64]string{}}
}

func (x *txWatch) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	g := goroutine()
	sql := strings.ToLower(strings.TrimSpace(d.SQL))
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case strings.HasPrefix(sql, "begin"):
		if x.txs[g] == nil {
			x.txs[g] = map[*pgx.Conn]string{}
		}
		x.txs[g][conn] = d.SQL
	case sql == "commit" || sql == "rollback":
		delete(x.txs[g], conn)
		if len(x.txs[g]) == 0 {
			delete(x.txs, g)
		}
	default:
		if _, ok := x.txs[g][conn]; ok {
			x.txs[g][conn] = d.SQL
		}
	}
	return ctx
}

func (x *txWatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// open reports whether the calling goroutine has a transaction open, and
// the statement it ran last.
func (x *txWatch) open() (string, bool) {
	g := goroutine()
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, last := range x.txs[g] {
		return last, true
	}
	return "", false
}

// goroutine is the calling goroutine's number, as its stack trace names it.
func goroutine() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	n, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return n
}

func (o outsideTx) Claim(ctx context.Context, c pipeline.ClaimSpec) (pipeline.Claimed, error) {
	o.check("claim for " + c.Consumer)
	if o.claimErr != nil {
		return pipeline.Claimed{}, o.claimErr
	}
	return o.p.Claim(ctx, c)
}

func (o outsideTx) Holdings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error) {
	o.check("read the holdings of " + consumer)
	return o.p.Holdings(ctx, consumer)
}

// CachedHoldings is checked only when it called Placement: an answer from
// the service's own record is no call.
func (o outsideTx) CachedHoldings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error) {
	hl, con, cached, err := o.svc.CachedVGPU(ctx, consumer)
	if !cached {
		o.check("read the holdings of " + consumer + " (not known yet)")
	}
	return hl, con, err
}

func (o outsideTx) Forget(consumer string) { o.p.Forget(consumer) }

func (o outsideTx) ReleaseUnits(ctx context.Context, consumer, provider, class string, amount, heldAfter int) error {
	o.check("release units of " + consumer)
	time.Sleep(o.releaseDelay)
	return o.p.ReleaseUnits(ctx, consumer, provider, class, amount, heldAfter)
}

func (o outsideTx) GPUAddress(provider string) string { return o.p.GPUAddress(provider) }

// MixedPFs passes the mixed GPUs' PFs through (drift.MixedOwned): no
// Placement call.
func (o outsideTx) MixedPFs() map[string][]string { return o.svc.MixedPFs() }

// ClaimMixed passes the pipeline's claims on mixed GPUs through, checked.
func (o outsideTx) ClaimMixed(ctx context.Context, host string, c pipeline.ClaimSpec) (pipeline.Claimed, error) {
	o.check("claim on a mixed GPU for " + c.Consumer)
	if o.claimErr != nil {
		return pipeline.Claimed{}, o.claimErr
	}
	return o.p.(pipeline.MixedClaimer).ClaimMixed(ctx, host, c)
}

// RetypeFor passes the pipeline's re-types on demand through, checked: a
// re-type calls Placement.
func (o outsideTx) RetypeFor(ctx context.Context, r pipeline.RetypeSpec) (pipeline.Retyped, error) {
	o.check("re-type on demand for " + r.Trait + " on " + r.Host)
	return o.p.(pipeline.Retyper).RetypeFor(ctx, r)
}

func (o outsideTx) ProviderAllocations(ctx context.Context, provider string) (map[string]map[string]int, error) {
	o.check("read the allocations of provider " + provider)
	return o.d.ProviderAllocations(ctx, provider)
}

func (o outsideTx) ConsumerType(ctx context.Context, consumer string) (string, error) {
	o.check("read the type of consumer " + consumer)
	return o.d.(drift.ConsumerTyper).ConsumerType(ctx, consumer)
}

// TestTxWatch: the watch sees a transaction open on the goroutine that
// opened it, not on another, and no longer once it committed.
func TestTxWatch(t *testing.T) {
	t.Parallel()
	x := newTxWatch()
	pool, err := store.Open(context.Background(), store.Config{URL: testsvc.Postgres(t), Tracer: x})
	testsvc.Must(t, err, "pool")
	t.Cleanup(pool.Close)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	testsvc.Must(t, err, "begin")
	_, err = tx.Exec(ctx, "SELECT 1")
	testsvc.Must(t, err, "select")
	if last, open := x.open(); !open || last != "SELECT 1" {
		t.Errorf("in the transaction: open %v, last %q; want open after SELECT 1", open, last)
	}
	other := make(chan bool)
	go func() { _, open := x.open(); other <- open }()
	if <-other {
		t.Errorf("another goroutine is seen in the transaction")
	}
	testsvc.Must(t, tx.Commit(ctx), "commit")
	if _, open := x.open(); open {
		t.Errorf("open after the commit")
	}
}
