package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// statements counts the statements of a pool by the first line that
// names what they do, for a test to ask how often a kind ran.
type statements struct {
	mu   sync.Mutex
	seen []statement
}

type statement struct {
	sql  string
	args []any
	conn *pgx.Conn
}

func (s *statements) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.seen = append(s.seen, statement{d.SQL, d.Args, c})
	s.mu.Unlock()
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// reset forgets the statements seen so far.
func (s *statements) reset() {
	s.mu.Lock()
	s.seen = nil
	s.mu.Unlock()
}

// count returns how many statements so far contain every one of parts
// and, when first is not nil, have first as their first argument.
func (s *statements) count(first any, parts ...string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
next:
	for _, q := range s.seen {
		for _, p := range parts {
			if !strings.Contains(q.sql, p) {
				continue next
			}
		}
		if first != nil && (len(q.args) == 0 || fmt.Sprint(q.args[0]) != fmt.Sprint(first)) {
			continue
		}
		n++
	}
	return n
}

// lastResultCost returns the statements and transactions of the last
// agent result recorded (UPDATE commands SET result_status): every
// transaction that recorded it (rolled back or committed), from its begin
// to its end on its connection, and every transaction that recorded its
// releases made afterwards (DELETE FROM planned_releases) and ended its
// request.
func (s *statements) lastResultCost() (n, txs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	const finish = "UPDATE commands SET result_status"
	var cmd any
	for _, q := range s.seen {
		if strings.Contains(q.sql, finish) && len(q.args) > 0 {
			cmd = q.args[0]
		}
	}
	for i, q := range s.seen {
		result := strings.Contains(q.sql, finish) && len(q.args) > 0 && fmt.Sprint(q.args[0]) == fmt.Sprint(cmd)
		if !result && !strings.Contains(q.sql, "DELETE FROM planned_releases") {
			continue
		}
		from := i
		for from > 0 && !(s.seen[from].conn == q.conn && strings.HasPrefix(s.seen[from].sql, "begin")) {
			from--
		}
		txs++
		for _, r := range s.seen[from:] {
			if r.conn != q.conn {
				continue
			}
			n++
			if r.sql == "commit" || r.sql == "rollback" {
				break
			}
		}
	}
	return n, txs
}

// decisionCost returns the statements (BEGIN and COMMIT not counted)
// and transactions of the decision of inbox event: from the first lock
// of the event to the commit of the transaction that closes it, on the
// decision's connection, with what that connection sends between its
// transactions.
func (s *statements) decisionCost(event int64) (n, txs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	const lock = "WHERE id = $1 AND processed_at IS NULL FOR UPDATE OF events SKIP LOCKED"
	from := -1
	for i, q := range s.seen {
		if strings.Contains(q.sql, lock) && len(q.args) > 0 && fmt.Sprint(q.args[0]) == fmt.Sprint(event) {
			from = i
			break
		}
	}
	if from < 0 {
		return 0, 0
	}
	conn, closing := s.seen[from].conn, false
	for _, q := range s.seen[from:] {
		if q.conn != conn {
			continue
		}
		switch {
		case q.sql == "begin":
		case q.sql == "commit" || q.sql == "rollback":
			txs++
			if closing {
				return n, txs
			}
		default:
			n++
			closing = closing || strings.Contains(q.sql, "DELETE FROM planned_claims")
		}
	}
	return n, txs
}

// TestDecidedOnce: a direct-path attach is decided once. The event is
// locked by two transactions: the decision, which reads the facts and the
// policy's state once and commits its planned claim, and the record of
// the claim made between them, which reads neither again. Each locks the
// request with the event, in the same statement. The planned
// claim is gone once the attachment is recorded.
func TestDecidedOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	st := &statements{}
	w.startBridge(replicaOpts{name: "r1", tracer: st})
	inst := w.domains[3].UUID
	// The instance's earlier events (Nova's, from the set-up) go first:
	// counted from when none is left.
	deadline := time.Now().Add(time.Minute)
	for {
		var open int
		if err := w.pool.QueryRow(w.ctx, `SELECT count(*) FROM events WHERE instance_uuid = $1 AND processed_at IS NULL`, inst).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events of %s still open after a minute", open, inst)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st.reset()

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("request %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
	var event int64
	if err := w.pool.QueryRow(w.ctx, `SELECT id FROM events WHERE request_id = $1`, id.String()).Scan(&event); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what  string
		first any
		parts []string
		want  int
	}{
		{"the event locked (decision, record)", event, []string{"WHERE id = $1 AND processed_at IS NULL FOR UPDATE OF events SKIP LOCKED"}, 2},
		// The request is locked and read with its event, in both.
		{"the request locked apart from the event (decision)", id, []string{"SELECT state FROM requests WHERE id = $1 FOR UPDATE"}, 0},
		{"the request locked apart from the event (record)", id, []string{"SELECT state, (SELECT coalesce(max(seq), 0) FROM commands"}, 0},
		{"the policy's load state read", inst, []string{"FROM policy_load_since WHERE instance_uuid"}, 1},
		{"the claim planned", event, []string{"INSERT INTO planned_claims"}, 1},
		{"the plan dropped with the record", event, []string{"DELETE FROM planned_claims"}, 1},
		{"the attachment recorded", nil, []string{"INSERT INTO vgpu_attachments"}, 1},
	} {
		if got := st.count(c.first, c.parts...); got != c.want {
			t.Errorf("%s: %d statements, want %d", c.what, got, c.want)
		}
	}
	// The session lock of the instance is taken and given back in
	// statements that do more (writePlan, CloseAppliedWith).
	if n := st.count(nil, "SELECT pg_try_advisory_lock("); n != 0 {
		t.Errorf("the instance's session lock taken in %d statements of its own, want 0", n)
	}
	if n := st.count(nil, "SELECT pg_advisory_unlock("); n != 0 {
		t.Errorf("the instance's session lock given back in %d statements of its own, want 0", n)
	}
	// In all, the decision's two transactions send seven statements:
	// the event locked, the facts read, the project's usage locked and
	// the plan written; the event locked again, the vGPUs recorded with
	// the request's move, the event closed with the move's notification.
	if n, txs := st.decisionCost(event); n != 7 || txs != 2 {
		t.Errorf("the decision: %d statements in %d transactions, want 7 in 2", n, txs)
	}
	var left int
	if err := w.pool.QueryRow(w.ctx, `SELECT count(*) FROM planned_claims WHERE instance_uuid = $1`, inst).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("planned claims left after the record: %d, want 0", left)
	}
}

func withClaimErr(o outsideTx, err error) outsideTx {
	o.claimErr = err
	return o
}

func withReleaseDelay(o outsideTx, d time.Duration) outsideTx {
	o.releaseDelay = d
	return o
}

// TestGivenUpDropsPlan: when Placement never takes the claim, the event is
// tried again (its plan replaced each time) until the bridge gives up; the
// request fails, and nothing it planned is left to count in the project's
// usage.
func TestGivenUpDropsPlan(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1", maxAttempts: 3, claimErr: errors.New("placement is away (injected by the test)")})
	inst := w.domains[3].UUID

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	r := w.wait(id, 90*time.Second)
	if r.State != requests.Failed || r.Code != flow.CodeEventFailed || !strings.Contains(r.Reason, "injected by the test") {
		t.Fatalf("request %s: %s (%s: %s), want failed with %s naming Placement's error", id, r.State, r.Code, r.Reason, flow.CodeEventFailed)
	}
	var attempts, planned int
	if err := w.pool.QueryRow(w.ctx, `SELECT attempts, (SELECT count(*) FROM planned_claims p WHERE p.event_id = e.id) FROM events e WHERE request_id = $1`,
		id.String()).Scan(&attempts, &planned); err != nil {
		t.Fatal(err)
	}
	if attempts < 3 || planned != 0 {
		t.Errorf("event: %d attempts, %d planned claims left; want 3 attempts and none left", attempts, planned)
	}
	if n := vgpuUnits(w.allocations(inst)); n != 0 {
		t.Errorf("VGPU held by %s: %d, want 0", inst, n)
	}
}

// TestReleasedOnce: an agent's result that gives a vGPU back runs its
// transaction once, and the request reads succeeded only once Placement
// has the units back. The result's transaction records the result, the
// planned release and the request's planned end, and commits; the release
// is made with no transaction open (outsideTx checks; Placement is slowed
// by a second); a second short transaction deletes the planned release and
// ends the request. Before: the request read succeeded a release (here a
// second) before Placement had the units back.
func TestReleasedOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	st := &statements{}
	w.startBridge(replicaOpts{name: "r1", tracer: st, releaseDelay: time.Second})
	inst := w.domains[4].UUID
	if r := w.wait(w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q"}), 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("attach: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	st.reset()
	rel := w.submit("GPU_RELEASE", inst, nil)
	if r := w.wait(rel, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("release: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	// Final: the units are back in Placement now, not a moment later.
	if n := vgpuUnits(w.allocations(inst)); n != 0 {
		t.Errorf("VGPU held when the release read succeeded: %d, want 0", n)
	}
	total, begins := st.count(nil), st.count(nil, "begin")
	for _, c := range []struct {
		what  string
		parts []string
		want  int
	}{
		{"results recorded (detach_vgpu, remove_mdev)", []string{"UPDATE commands SET result_status"}, 2},
		{"the release planned", []string{"INSERT INTO planned_releases"}, 1},
		{"the end planned", []string{"INSERT INTO planned_finishes"}, 1},
		{"the release recorded made", []string{"DELETE FROM planned_releases"}, 1},
		{"the end made", []string{"DELETE FROM planned_finishes"}, 1},
		{"transactions rolled back", []string{"rollback"}, 0},
	} {
		if got := st.count(nil, c.parts...); got != c.want {
			t.Errorf("%s: %d statements, want %d", c.what, got, c.want)
		}
	}
	last, lastBegins := st.lastResultCost()
	t.Logf("GPU_RELEASE, webhook to released: %d statements, %d transactions; the result that releases: %d statements, %d transactions (pipeline pool)",
		total, begins, last, lastBegins)
	var left, ends, finals int
	if err := w.pool.QueryRow(w.ctx, `SELECT (SELECT count(*) FROM planned_releases WHERE instance_uuid = $1),
		(SELECT count(*) FROM planned_finishes WHERE request_id = $2),
		(SELECT count(*) FROM audit_log WHERE request_id::text = $3 AND action = 'transition' AND detail->>'to' = 'succeeded')`, inst, rel, rel.String()).Scan(&left, &ends, &finals); err != nil {
		t.Fatal(err)
	}
	if left != 0 || ends != 0 || finals != 1 {
		t.Errorf("planned releases left: %d, planned ends left: %d, final transitions: %d; want 0, 0, 1", left, ends, finals)
	}
}

// TestAttachResultOnce: the agent's result that completes a direct-path
// attach is taken in one transaction of three statements (the result
// recorded with its request read and locked; the attachment marked
// attached with its usage opened; the request's success with its audit,
// change event and notification), and writes what each did apart: the
// audited moves, the vgpu.attach.end notification naming the vGPU
// attached, the bridge.vgpu_changed event, the usage interval; the relay
// recorded the command sent once with the request's move to dispatched.
func TestAttachResultOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	st := &statements{}
	w.startBridge(replicaOpts{name: "r1", tracer: st})
	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	r := w.wait(id, 60*time.Second)
	if r.State != requests.Succeeded || r.Reason != "1 vGPU(s) attached" || r.DispatchedAt == nil || r.FinishedAt == nil {
		t.Fatalf("request %s: %s (%s: %s), dispatched %v, finished %v; want succeeded, 1 vGPU(s) attached", id, r.State, r.Code, r.Reason,
			r.DispatchedAt, r.FinishedAt)
	}
	n, txs := st.lastResultCost()
	if n != 5 || txs != 1 {
		t.Errorf("the result that completes the attach: %d statements (begin and commit counted) in %d transactions, want 5 in 1", n, txs)
	}
	var moves, note, noteState, noteProject, noteReason, changed string
	var usage, sentOnce int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT
			(SELECT string_agg((detail->>'from') || '>' || (detail->>'to'), ',' ORDER BY id) FROM audit_log
				WHERE request_id::text = $1 AND action = 'transition'),
			(SELECT string_agg(event_type, ',' ORDER BY id) FROM bridge_notifications WHERE payload->'versioned_object.data'->>'request_id' = $1),
			coalesce((SELECT payload->'versioned_object.data'->'vgpus'->0->>'state' FROM bridge_notifications
				WHERE payload->'versioned_object.data'->>'request_id' = $1 AND event_type = 'vgpu.attach.end'), ''),
			coalesce((SELECT payload->'versioned_object.data'->>'project_id' FROM bridge_notifications
				WHERE payload->'versioned_object.data'->>'request_id' = $1 AND event_type = 'vgpu.attach.end'), ''),
			coalesce((SELECT payload->'versioned_object.data'->>'reason' FROM bridge_notifications
				WHERE payload->'versioned_object.data'->>'request_id' = $1 AND event_type = 'vgpu.attach.end'), ''),
			coalesce((SELECT event_type FROM events WHERE source = 'bridge' AND message_id = 'vgpu_changed:' || $1::text), ''),
			(SELECT count(*) FROM vgpu_usage u JOIN vgpu_attachments a ON a.id = u.attachment_id WHERE a.request_id::text = $1 AND u.ended_at IS NULL),
			(SELECT count(*) FROM commands WHERE request_id::text = $1 AND publish_attempts = 1 AND sent_at IS NOT NULL AND last_error IS NULL)`,
		id.String()).Scan(&moves, &note, &noteState, &noteProject, &noteReason, &changed, &usage, &sentOnce), "rows of the attach")
	if moves != "accepted>decided,decided>dispatched,dispatched>succeeded" {
		t.Errorf("audited moves %s", moves)
	}
	if note != "vgpu.attach.start,vgpu.attach.end" || noteState != "attached" || noteProject != w.project || noteReason != r.Reason {
		t.Errorf("notifications %s; vgpu.attach.end: vGPU %q, project %q, reason %q; want the vGPU attached, project %s, reason %q",
			note, noteState, noteProject, noteReason, w.project, r.Reason)
	}
	if changed != "vgpu_changed" || usage != 1 || sentOnce != 1 {
		t.Errorf("change event %q, open usage intervals %d, commands sent once %d; want vgpu_changed, 1, 1", changed, usage, sentOnce)
	}
}
