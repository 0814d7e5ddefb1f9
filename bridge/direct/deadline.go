package direct

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// Run fails the requests whose deadline passed (CheckDeadlines) every
// WatchdogInterval until ctx ends; paused ("deadlines"), it fails none.
func (p *Path) Run(ctx context.Context) error {
	wake.Every(ctx, p.cfg.WatchdogInterval, func(ctx context.Context) {
		if p.paused(ctx, "deadlines") {
			return // paused: no decisions, failing requests included
		}
		if _, err := p.CheckDeadlines(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("pipeline: deadline check failed", logkey.Err, err)
		}
	})
	return nil
}

// compensateEnded compensates requests that ended while their vGPUs were
// in flight without the pipeline ending them (an operator's cancel).
func (p *Path) compensateEnded(ctx context.Context) (int, error) {
	n := 0
	for {
		done := false
		err := p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var id uuid.UUID
			var st, reason, code string
			err := tx.QueryRow(ctx, `SELECT r.id, r.state, coalesce(r.reason,''), coalesce(r.code,'') FROM requests r
				WHERE r.state IN ('failed','rejected') AND EXISTS (SELECT 1 FROM vgpu_attachments a
					WHERE (a.request_id = r.id AND a.state = 'pending') OR (a.release_request_id = r.id AND a.state = 'releasing'))
				LIMIT 1 FOR UPDATE OF r SKIP LOCKED`).Scan(&id, &st, &reason, &code)
			if errors.Is(err, pgx.ErrNoRows) {
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			return p.compensate(ctx, tx, id, code, fmt.Sprintf("request %s while in flight: %s", st, orDefault(reason, code)), nil)
		})
		if err != nil || done {
			return n, err
		}
		n++
	}
}

// CheckDeadlines fails the requests whose deadline passed without every
// answer, with the reason naming the command and host that did not
// answer, and compensates them. Replicas share the work (SKIP LOCKED).
func (p *Path) CheckDeadlines(ctx context.Context) (int, error) {
	n := 0
	for {
		done := false
		err := p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var id uuid.UUID
			err := tx.QueryRow(ctx, `SELECT id FROM requests WHERE state IN ('accepted','decided','dispatched')
				AND deadline_at IS NOT NULL AND deadline_at < now()
				AND NOT EXISTS (SELECT 1 FROM planned_finishes f WHERE f.request_id = requests.id)
				ORDER BY deadline_at LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			code, reason, err := p.timeoutReason(ctx, tx, id)
			if err != nil {
				return err
			}
			return p.failRequest(ctx, tx, id, code, reason, nil)
		})
		if err != nil {
			return n, err
		}
		if done {
			m, err := p.compensateEnded(ctx)
			return n + m, err
		}
		n++
		p.kickOutbox()
	}
}

func (p *Path) timeoutReason(ctx context.Context, tx pgx.Tx, id uuid.UUID) (string, string, error) {
	var cmdID, kind, host string
	var sentAt *time.Time
	var deadline time.Time
	err := tx.QueryRow(ctx, `SELECT c.id::text, c.kind, c.host, c.sent_at, r.deadline_at FROM commands c JOIN requests r ON r.id = c.request_id
		WHERE c.request_id = $1 AND c.purpose = 'action' AND (c.finished_at IS NULL OR c.result_status IN ('expired','cancelled'))
		ORDER BY c.seq LIMIT 1`, id).Scan(&cmdID, &kind, &host, &sentAt, &deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return flow.CodeAgentTimeout, fmt.Sprintf("the request did not finish within %s", p.cfg.RequestTimeout), nil
	}
	if err != nil {
		return "", "", err
	}
	if sentAt == nil {
		return flow.CodeNotPublished, fmt.Sprintf("command %s (%s) for host %s could not be published to RabbitMQ before the deadline %s",
			kind, cmdID, host, deadline.UTC().Format(time.RFC3339)), nil
	}
	return flow.CodeAgentTimeout, fmt.Sprintf("the agent of host %s did not answer %s (command %s, sent %s) by the deadline %s; is vgpu-agent running there and consuming %s?",
		host, kind, cmdID, sentAt.UTC().Format(time.RFC3339), deadline.UTC().Format(time.RFC3339), protocol.AgentQueue(host)), nil
}
