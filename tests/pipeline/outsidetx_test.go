package pipeline_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// outsideTx wraps the Placement that the pipeline and the drift reconciler
// call. After each call it asks Postgres whether a transaction of the
// test's database sat idle through the whole call: the mark of a
// Placement call made while its caller held a transaction open. Such
// calls fail the test when it ends, named with the query the transaction
// ran last.
type outsideTx struct {
	t    *testing.T
	pool *pgxpool.Pool
	p    pipeline.Placement
	d    drift.Placement
	svc  *placement.Service
	mu   *sync.Mutex
	bad  *[]string
	// claimErr, when set, is what every claim answers (Placement away).
	claimErr error
}

func newOutsideTx(t *testing.T, pool *pgxpool.Pool, svc *placement.Service) outsideTx {
	o := outsideTx{t: t, pool: pool, p: pipeline.ServiceAdapter{S: svc}, d: drift.ServiceAdapter{S: svc}, svc: svc, mu: &sync.Mutex{}, bad: &[]string{}}
	t.Cleanup(func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, b := range *o.bad {
			t.Errorf("a Placement call ran inside a transaction: %s", b)
		}
	})
	return o
}

func (o outsideTx) check(what string, start time.Time) {
	var n int
	var q string
	err := o.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(string_agg(left(query, 160), ' | '), '') FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND state_change < $1`, start).Scan(&n, &q)
	if err != nil || n == 0 {
		return
	}
	o.mu.Lock()
	*o.bad = append(*o.bad, fmt.Sprintf("%s (open transaction, last query: %s)", what, q))
	o.mu.Unlock()
}

func (o outsideTx) Claim(ctx context.Context, c pipeline.ClaimSpec) (pipeline.Claimed, error) {
	defer o.check("claim for "+c.Consumer, time.Now())
	if o.claimErr != nil {
		return pipeline.Claimed{}, o.claimErr
	}
	return o.p.Claim(ctx, c)
}

func (o outsideTx) Holdings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error) {
	defer o.check("read the holdings of "+consumer, time.Now())
	return o.p.Holdings(ctx, consumer)
}

// CachedHoldings is checked only when it called Placement: an answer from
// the service's own record takes microseconds, during which another
// worker's transaction is often between two statements.
func (o outsideTx) CachedHoldings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error) {
	start := time.Now()
	hl, con, cached, err := o.svc.CachedVGPU(ctx, consumer)
	if !cached {
		o.check("read the holdings of "+consumer+" (not known yet)", start)
	}
	return hl, con, err
}

func (o outsideTx) Forget(consumer string) { o.p.Forget(consumer) }

func (o outsideTx) ReleaseUnits(ctx context.Context, consumer, provider, class string, amount, heldAfter int) error {
	defer o.check("release units of "+consumer, time.Now())
	return o.p.ReleaseUnits(ctx, consumer, provider, class, amount, heldAfter)
}

func (o outsideTx) GPUAddress(provider string) string { return o.p.GPUAddress(provider) }

func (o outsideTx) ProviderAllocations(ctx context.Context, provider string) (map[string]map[string]int, error) {
	defer o.check("read the allocations of provider "+provider, time.Now())
	return o.d.ProviderAllocations(ctx, provider)
}

func (o outsideTx) ConsumerType(ctx context.Context, consumer string) (string, error) {
	defer o.check("read the type of consumer "+consumer, time.Now())
	return o.d.(drift.ConsumerTyper).ConsumerType(ctx, consumer)
}
