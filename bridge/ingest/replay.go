package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ReplayResult is what became of a replayed dead letter's body.
type ReplayResult struct {
	// Accepted: a new inbox row (EventID) was written.
	Accepted bool
	// Duplicate: the inbox holds the message id already.
	Duplicate bool
	EventID   int64
	MessageID string
	EventType string
	// Reason and Detail say why the body is still refused (neither
	// Accepted nor Duplicate): by decoding and validation, or by Postgres
	// (a value it cannot store); nothing was written then.
	Reason, Detail string
}

// Source is the inbox source of this consumer's events ("nova").
func (c *Consumer) Source() string { return c.cfg.Source }

// Replay runs a dead letter's stored body through the same decoding,
// validation and inbox write as a delivery (deduplicated on message_id,
// state applied, OnApplied called). A body still refused is not written
// again as a dead letter. A body Postgres refuses as data (a value it
// cannot store) is answered as refused, with Postgres's reason, not as an
// error: retrying it cannot succeed.
func (c *Consumer) Replay(ctx context.Context, raw []byte) (ReplayResult, error) {
	it := c.decode(&amqp.Delivery{Body: raw, Exchange: "replay", RoutingKey: "replay"})
	if it.ev == nil {
		return ReplayResult{Reason: it.reason, Detail: it.detail, MessageID: it.msgID}, nil
	}
	out := ReplayResult{MessageID: it.ev.Message.MessageID, EventType: it.ev.Message.EventType}
	start := time.Now()
	res, err := c.applyBatch(ctx, []*item{it})
	if isDataError(err) {
		out.Reason, out.Detail = ReasonSchema, cleanText("database refused it: "+err.Error())
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("replay %s: %w", out.MessageID, err)
	}
	c.m.observe(res, time.Since(start))
	if res.duplicates > 0 || it.ev.ID == 0 {
		out.Duplicate = true
		return out, nil
	}
	out.Accepted, out.EventID = true, it.ev.ID
	return out, nil
}

// MarkReplayed records in tx that dead letter id was replayed by who,
// into inbox event eventID (0: none).
func MarkReplayed(ctx context.Context, tx pgx.Tx, id int64, who string, eventID int64) error {
	_, err := tx.Exec(ctx, `UPDATE dead_letters SET replayed_at = now(), replayed_by = $2, replay_event_id = nullif($3, 0) WHERE id = $1`,
		id, who, eventID)
	return err
}

// PurgeDeadLetters deletes up to n dead letters received before cutoff
// (the retention purge); it returns how many.
func PurgeDeadLetters(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters WHERE received_at < $1
		ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, cutoff, n)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
