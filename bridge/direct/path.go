package direct

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
)

// Pipeline is what the direct path needs of the pipeline that hands it
// its work (pipeline.Processor).
type Pipeline interface {
	// Lend gives the pipeline's configuration, collaborators and counters.
	Lend() pipeline.Lent
	// InTx runs fn in a transaction of the pipeline: the claims
	// FailRequest and the completion of a request give back in it
	// (pipeline.ReleaseFor) are made once it committed, and the request
	// ends after them (pipeline.Finish).
	InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error
}

// Path runs the direct path: the pipeline's DirectPath (ActPlan, Claim,
// ReleaseClaims: claims, attachments and commands; FailRequest), a result
// taker (TakeResult) and its own loop (Run) for deadlines.
type Path struct {
	cfg   pipeline.Config
	d     pipeline.Deps
	count pipeline.Counters
	pipe  Pipeline
	dec   pipeline.Decisions // its part in the decisions it takes part in (ActPlan, FollowMove)
	log   *slog.Logger
}

var (
	_ pipeline.ResultTaker = (*Path)(nil)
	_ pipeline.DirectPath  = (*Path)(nil)
)

// New builds the direct path of pipe: it works with pipe's Placement,
// policy, request store and configuration.
func New(pipe Pipeline) *Path {
	l := pipe.Lend()
	return &Path{cfg: l.Config, d: l.Deps, count: l.Counters, pipe: pipe, dec: l.Decisions, log: l.Deps.Log}
}

// Wire makes proc a pipeline of the direct path alone (tests,
// benchmarks): its default stages, this path as their actor, the taker
// of every result and the pipeline's DirectPath. The bridge wires both paths itself
// (setupPipeline). Run the returned Path's loop beside proc's.
func Wire(proc *pipeline.Processor) *Path {
	p := New(proc)
	proc.Use(pipeline.Paths{Stages: pipeline.DefaultStages(proc.Lend(), p, p.FollowMove()), Results: []pipeline.ResultTaker{p}, Direct: p})
	return p
}

func (p *Path) actor() string { return "vgpu-bridge/" + p.cfg.Replica }

// paused reports whether operators paused part of the pipeline; errors
// count as not paused.
func (p *Path) paused(ctx context.Context, part string) bool {
	return pipeline.Paused(ctx, p.d.Controls, p.log, part)
}

func (p *Path) kickOutbox() {
	if p.d.OnOutbox != nil {
		p.d.OnOutbox()
	}
}

// wrapErr prefixes *errp, when set, with what failed and its ids; the
// cause stays reachable (errors.Is, errors.As).
func wrapErr(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf(format+": %w", append(args, *errp)...)
	}
}

func joinNonEmpty(sep string, parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, sep)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
