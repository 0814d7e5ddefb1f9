package controls_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// BenchmarkGate measures what the operator controls add to each event's
// decision transaction: one statement reading the switches under the
// shared advisory lock and the event's request id (BEGIN/COMMIT included,
// see BenchmarkEmptyTx for them alone).
func BenchmarkGate(b *testing.B) {
	ctx := context.Background()
	pool := testsvc.Pool(b, testsvc.MigratedPostgres(b))
	var id int64
	testsvc.Must(b, pool.QueryRow(ctx, `INSERT INTO events (source, message_id, event_type, payload, global_request_id)
		VALUES ('nova', 'm', 'x', '{}', 'req-5f1c0d6e-8a41-4c1e-9d55-3a7c2b9e0f11') RETURNING id`).Scan(&id), "event")
	st := controls.NewStore(pool, nil, nil)
	b.ResetTimer()
	for b.Loop() {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := st.Gate(ctx, tx, id)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEmptyTx is BEGIN; SELECT 1; COMMIT, the baseline of BenchmarkGate.
func BenchmarkEmptyTx(b *testing.B) {
	ctx := context.Background()
	pool := testsvc.Pool(b, testsvc.MigratedPostgres(b))
	for b.Loop() {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
