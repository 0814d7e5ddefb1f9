package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestReplayStillRefusedByDatabase: replaying a dead letter whose body
// Postgres still refuses (refuseMarked)
// answers 422 problem+json still_invalid naming Postgres's reason, not a
// 500, and the dead letter stays, not marked replayed.
func TestReplayStillRefusedByDatabase(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	r.declare(cfg)
	ts := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	refuseMarked(t, r)
	r.publish(infoKey, poisoned(t, "surrogate", "5b1e5a6c-0b43-4bd8-9a2f-2a3cbd7e6f10", poison, ts))
	run := r.start(cfg)
	r.waitCount(1, 30*time.Second, `SELECT count(*) FROM dead_letters WHERE message_id = 'surrogate'`)
	var id int64
	testsvc.Must(t, r.pool.QueryRow(context.Background(), `SELECT id FROM dead_letters WHERE message_id = 'surrogate'`).Scan(&id), "dead letter")

	srv := api.New(api.Config{Auth: headerAuth{}})
	(&controls.API{Store: controls.NewStore(r.pool, nil, nil), Replayer: run.c}).Register(srv)
	hs := httptest.NewServer(srv.Echo())
	defer hs.Close()
	req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/dead-letters/"+strconv.FormatInt(id, 10)+"/replay", nil)
	req.Header.Set("X-Test-Role", "admin")
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(t, err, "replay")
	defer resp.Body.Close()
	var p api.ProblemDetails
	json.NewDecoder(resp.Body).Decode(&p) //nolint:errcheck
	if resp.StatusCode != http.StatusUnprocessableEntity || resp.Header.Get("Content-Type") != api.ProblemContentType ||
		p.Code != "still_invalid" || !strings.Contains(p.Detail, "database refused it") {
		t.Fatalf("replay of a body Postgres refuses: %d %s %+v; want 422 problem+json still_invalid naming the database's reason",
			resp.StatusCode, resp.Header.Get("Content-Type"), p)
	}
	if n := r.count(`SELECT count(*) FROM dead_letters WHERE id = $1 AND replayed_at IS NULL`, id); n != 1 {
		t.Errorf("the dead letter is gone or marked replayed")
	}
	if n := r.count(`SELECT count(*) FROM events WHERE message_id = 'surrogate'`); n != 0 {
		t.Errorf("%d events of the refused body", n)
	}
}

// TestDeadLetterKeptOnce: a message dead-lettered and delivered again (a
// publisher's retry, a redelivery after a consumer died before its
// acknowledgement), in the same batch or a later one, is kept as one dead
// letter: on its message_id, or on its body's digest when it has none.
func TestDeadLetterKeptOnce(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	r.declare(cfg)
	ts := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	const uuid = "5b1e5a6c-0b43-4bd8-9a2f-2a3cbd7e6f10"
	garbage := []byte("not json, no message id")
	refuseMarked(t, r)
	refused := poisoned(t, "poison-1", uuid, poison, ts)
	r.publish(infoKey, garbage, refused, garbage, []byte("other garbage"))
	run := r.start(cfg)
	r.waitCount(3, 30*time.Second, `SELECT count(*) FROM dead_letters`)
	r.publish(infoKey, refused, garbage, instanceMsg(t, "ok-after", "instance.update", uuid, "active", "h1", nil, ts.Add(time.Second)))
	r.waitCount(1, 30*time.Second, `SELECT count(*) FROM events WHERE message_id = 'ok-after'`)
	if n := r.count(`SELECT count(*) FROM dead_letters`); n != 3 {
		t.Errorf("%d dead letters, want 3: each message kept once however often delivered", n)
	}
	if n := r.count(`SELECT count(*) FROM dead_letters WHERE message_id = 'poison-1'`); n != 1 {
		t.Errorf("%d dead letters of message poison-1, want 1", n)
	}
	if got := run.metric("vgpu_bridge_notifications_dead_letters_total"); got != 3 {
		t.Errorf("dead letters metric %v, want 3", got)
	}
}
