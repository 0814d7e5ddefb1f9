package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// expireEvery is the least time between two looks for commands that
// expired unsent (relayOnce).
const expireEvery = time.Second

// queueGrace keeps a command in its agent's queue a little past its
// expiry (clock skew); after that RabbitMQ drops it.
const queueGrace = time.Minute

func (x *Dispatcher) relayLoop(ctx context.Context, ch *amqp.Channel) error {
	st := &relayState{declared: map[string]bool{}}
	return wake.Loop(ctx, x.kick.C(), func(ctx context.Context) (time.Duration, error) {
		n, err := x.relayOnce(ctx, ch, st)
		if err != nil {
			if ch.IsClosed() {
				return 0, err
			}
			if ctx.Err() == nil {
				x.log.Warn("dispatch: relay round failed", logkey.Err, err)
			}
		}
		if n >= x.cfg.RelayBatch {
			return 0, nil
		}
		return x.cfg.RelayInterval, nil
	})
}

// relayState is what one relay loop keeps between its rounds.
type relayState struct {
	declared map[string]bool // agent queues declared on the channel
	expired  time.Time       // when unsent commands were last expired
}

type outRow struct {
	id      uuid.UUID
	host    string
	kind    string
	body    []byte
	expires *time.Time
	request *uuid.UUID
	purpose string
	signed  bool // body is the signed command, or one rewritten at its host's minor: kept in the row when sent
	// hostMinor is the protocol minor the host's agent last reported;
	// nil when it never reported.
	hostMinor *int
	deferred  *amqp.DeferredConfirmation
	err       error
}

// relayOnce publishes one batch of due commands and marks those the broker
// confirmed as sent, in one transaction holding their rows (SKIP LOCKED:
// another replica takes other rows). It returns how many it sent.
func (x *Dispatcher) relayOnce(ctx context.Context, ch *amqp.Channel, st *relayState) (int, error) {
	declared := st.declared
	// Expired before they could go out: the request's deadline handles it.
	// The outbox's read leaves expired commands out, so this need not run
	// at every round: once per relay interval, at most once a second.
	if time.Since(st.expired) >= max(x.cfg.RelayInterval, expireEvery) {
		n, err := requests.ExpireUnsent(ctx, x.d.Pool)
		if err != nil {
			return 0, err
		}
		st.expired = time.Now()
		x.m.expired.Add(float64(n))
	}
	sent := 0
	err := pgx.BeginFunc(ctx, x.d.Pool, func(tx pgx.Tx) error {
		sent = 0
		if x.d.Hold != nil {
			if held, err := x.d.Hold(ctx, tx); err != nil || held {
				return err // operators hold the outbox: nothing is sent
			}
		}
		rows, err := tx.Query(ctx, `SELECT c.id, c.host, c.kind, c.body, c.expires_at, c.request_id, c.purpose,
				CASE WHEN h.report IS NOT NULL THEN coalesce((h.report->>'minor')::int, 0) END
			FROM commands c LEFT JOIN hosts h ON h.name = c.host
			WHERE c.sent_at IS NULL AND c.finished_at IS NULL AND (c.expires_at IS NULL OR c.expires_at > now())
			  AND NOT EXISTS (SELECT 1 FROM commands q WHERE q.request_id = c.request_id AND q.purpose = c.purpose AND q.seq < c.seq
			        AND (q.finished_at IS NULL OR (c.purpose = 'action' AND q.result_status IS DISTINCT FROM 'succeeded')))
			ORDER BY c.created_at, c.seq LIMIT $1 FOR UPDATE OF c SKIP LOCKED`, x.cfg.RelayBatch)
		if err != nil {
			return fmt.Errorf("read outbox: %w", err)
		}
		var out []*outRow
		for rows.Next() {
			r := &outRow{}
			if err := rows.Scan(&r.id, &r.host, &r.kind, &r.body, &r.expires, &r.request, &r.purpose, &r.hostMinor); err != nil {
				rows.Close()
				return err
			}
			out = append(out, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(out) == 0 {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, x.cfg.ConfirmTimeout)
		defer cancel()
		for _, r := range out {
			if x.cfg.DeclareAgentQueues && !declared[r.host] {
				if err := declareAgentQueue(ch, x.cfg.Exchange, r.host); err != nil {
					return err // the channel is gone after a failed declare
				}
				declared[r.host] = true
			}
			signer := x.keys().Signer
			var changed bool
			if r.body, changed, r.err = outgoing(r.body, r.hostMinor, signer); r.err != nil {
				continue
			}
			r.signed = changed // what went out is kept in the row when it differs from what is stored
			pub := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: r.id.String(),
				Timestamp: time.Now(), Type: r.kind, Body: r.body}
			if r.expires != nil {
				ttl := time.Until(*r.expires) + queueGrace
				pub.Expiration = strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)
			}
			r.deferred, r.err = ch.PublishWithDeferredConfirmWithContext(pctx, x.cfg.Exchange, protocol.CommandRoutingKey(r.host), false, false, pub)
		}
		var ok []*outRow
		for _, r := range out {
			if r.err == nil && r.deferred != nil {
				acked, err := r.deferred.WaitContext(pctx)
				switch {
				case err != nil:
					r.err = fmt.Errorf("no confirm: %w", err)
				case !acked:
					r.err = errors.New("the broker refused the message (nack)")
				}
			}
			if r.err != nil {
				x.m.published.WithLabelValues("failed").Inc()
				if err := requests.PublishFailed(ctx, tx, r.id, r.err.Error()); err != nil {
					return err
				}
				continue
			}
			ok = append(ok, r)
		}
		sent = len(ok)
		return x.markSent(ctx, tx, ok)
	})
	return sent, err
}

// markSent records the commands the broker confirmed as sent and moves
// the requests whose first command went out from decided to dispatched:
// the commands are recorded in the statement of the first request's move
// (requests.Store.TransitionIfSent), or in one of their own
// (requests.SentBatch) where none moves.
func (x *Dispatcher) markSent(ctx context.Context, tx pgx.Tx, ok []*outRow) error {
	cmds := make([]requests.SentCommand, 0, len(ok))
	for _, r := range ok {
		// A signed (or rewritten) row keeps what went out (key_id and
		// sig included): a refusal's body_sha256 is checked against it
		// (ownRefusal).
		c := requests.SentCommand{ID: r.id}
		if r.signed {
			c.Signed = r.body
		}
		cmds = append(cmds, c)
	}
	seen := map[uuid.UUID]bool{}
	for _, r := range ok {
		if r.request == nil || r.purpose != "action" || seen[*r.request] {
			continue
		}
		seen[*r.request] = true
		if _, _, err := x.d.Requests.TransitionIfSent(ctx, tx, *r.request, requests.Decided, requests.Dispatched,
			x.d.Phase(protocol.Kind(r.kind)), "", "", cmds); err != nil {
			return err
		}
		cmds = nil // recorded
	}
	if err := requests.SentBatch(ctx, tx, cmds); err != nil {
		return err
	}
	for range ok {
		x.m.published.WithLabelValues("sent").Inc()
	}
	return nil
}

// declareAgentQueue declares vgpu.agent.<host> exactly as the agent does.
func declareAgentQueue(ch *amqp.Channel, exchange, host string) error {
	q := protocol.AgentQueue(host)
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", q, err)
	}
	if err := ch.QueueBind(q, protocol.CommandRoutingKey(host), exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", q, err)
	}
	return nil
}

// outgoing is the command as it goes out to its host, decoded once: at
// the minor the host's agent reads (the bridge's own, or the one before
// for an agent not yet upgraded or never heard from; it ignores what the
// bridge's minor added), and signed when signer is set. changed is false
// when body goes out as stored.
func outgoing(body []byte, hostMinor *int, signer *protocol.Signer) (out []byte, changed bool, err error) {
	var c protocol.Command
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, false, fmt.Errorf("outbox body is not a command: %w", err)
	}
	want := protocol.Minor - 1
	if hostMinor != nil {
		want = min(max(*hostMinor, protocol.Minor-1), protocol.Minor)
	}
	if c.Minor == want && signer == nil {
		return body, false, nil
	}
	c.Minor = want
	if signer != nil {
		if err := signer.SignCommand(&c); err != nil {
			return nil, false, fmt.Errorf("sign command: %w", err)
		}
	}
	out, err = json.Marshal(c)
	return out, err == nil, err
}
