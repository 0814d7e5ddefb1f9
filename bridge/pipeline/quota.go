package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// A decision checks its project's quota against the usage it reads. Two
// decisions of one project that read the same usage could both pass and
// together exceed the quota, so a decision that adds to the usage holds
// the project's lock from its read of the usage to its commit.
//
// Holding it from the read, as a decision's facts are loaded, serialises
// a project's decisions for the whole of their rounds, including the
// first, which only stops for the Placement claim and rolls back. In a
// burst of one project (a pool scaled up at once) that lock was most of
// what the decisions waited for. So the decision's round reads the usage
// without the lock (the Evaluate stage), and takes the lock only just
// before it writes what adds to the usage (its attachments, a Nova resize
// under way), reading the usage again: when it is what the decision was
// taken on, the decision stands, and it commits holding the lock; when it
// moved, the round runs again, this time locking before it reads. A round
// that adds nothing (a rejection, a release, a round that stops for its
// claim) never takes the lock. A rejection read without the lock is one
// taken a moment earlier: what it read had committed.

// quotaGuard is one decision's view of its project's usage (Work.quota).
type quotaGuard struct {
	p       *Processor
	eager   bool // lock before reading: the usage moved in an earlier round
	project string
	usage   policy.Usage // what the decision read
	locked  bool
}

// usageRead says how loadFacts reads a project's usage: under a decision's
// guard (nil: none) and, with lazy, without the lock (Evaluate's read;
// the decision locks later, in LockQuota). Other reads lock as they read.
type usageRead struct {
	guard *quotaGuard
	lazy  bool
}

// lazily is Evaluate's read of the usage under g: without the lock unless
// an earlier round saw the usage move.
func (g *quotaGuard) lazily() usageRead {
	return usageRead{guard: g, lazy: g != nil && !g.eager}
}

// errQuotaMoved stops a round whose project's usage changed between its
// read and the lock: the decision runs again, locking first.
var errQuotaMoved = errors.New("the project's vGPU usage changed while the decision was taken")

// readUsage reads project's usage for a decision, locking it first
// unless ur.lazy.
func (p *Processor) readUsage(ctx context.Context, tx pgx.Tx, project string, ur usageRead) (policy.Usage, error) {
	g := ur.guard
	if !ur.lazy {
		if err := lockProject(ctx, tx, project); err != nil {
			return policy.Usage{}, err
		}
	}
	u, err := p.projectUsage(ctx, tx, project)
	if err != nil || g == nil {
		return u, err
	}
	if g.locked && g.project != project {
		return u, nil // another project's, read for another purpose: the guard keeps the first
	}
	g.project, g.usage, g.locked = project, u, g.locked || !ur.lazy
	return u, nil
}

func lockProject(ctx context.Context, tx pgx.Tx, project string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('vgpu-bridge/quota/' || $1, 0))`, project); err != nil {
		return fmt.Errorf("lock the usage of project %s: %w", project, err)
	}
	return nil
}

// LockQuota is called by a decision just before it writes what adds to
// its project's vGPU usage (attachments, a Nova resize under way): it
// takes the project's lock, held to the commit, and checks that the usage
// the decision was taken on has not moved meanwhile. Outside a decision,
// or once locked, it does nothing.
func (w *Work) LockQuota(ctx context.Context) error {
	g := w.quota
	if g == nil || g.locked || g.project == "" {
		return nil
	}
	if err := lockProject(ctx, w.Tx, g.project); err != nil {
		return err
	}
	g.locked = true
	u, err := g.p.projectUsage(ctx, w.Tx, g.project)
	if err != nil {
		return err
	}
	if u != g.usage {
		return errQuotaMoved
	}
	return nil
}
