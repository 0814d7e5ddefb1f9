package controls_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestDeadLetterReplay: a notification dead-lettered as oversize under a
// small [notifications] max_message_bytes is replayed after the cap was
// raised and takes effect; bodies still bad, capped when kept, or replayed
// twice are answered precisely; every replay is audited.
func TestDeadLetterReplay(t *testing.T) {
	f := newFleet(t)
	f.start("notifications.max_message_bytes=4096", "notifications.dead_letter_max_bytes=16384")
	b := f.hosts[1]
	f.notifyCreates()

	long := strings.Repeat("firmware update pending; ", 240) // ~6 KB: over 4096, under 16384
	noID := func() []byte {
		inner, _ := json.Marshal(map[string]any{"event_type": "service.update", "priority": "INFO", "publisher_id": "nova-api:x",
			"timestamp": "2024-05-01 12:00:00.000001", "payload": map[string]any{}})
		env, _ := json.Marshal(map[string]any{"oslo.version": "2.0", "oslo.message": string(inner)})
		return env
	}
	f.publish(
		serviceUpdate(t, b, true, long),                // oversize, kept whole
		serviceUpdate(t, b, true, long+long+long+long), // oversize, kept capped (~24 KB)
		noID(), // no message_id: bad for good
	)
	dead := map[string]int64{} // kind → dead letter id
	f.waitFor(30*time.Second, "three dead letters", func() bool {
		rows, err := f.pool.Query(f.ctx, `SELECT id, reason, raw_truncated FROM dead_letters WHERE source = 'nova' ORDER BY id`)
		if err != nil {
			return false
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			var reason string
			var trunc bool
			if rows.Scan(&id, &reason, &trunc) != nil {
				return false
			}
			switch {
			case reason == "oversize" && trunc:
				dead["capped"] = id
			case reason == "oversize":
				dead["oversize"] = id
			default:
				dead["bad"] = id
			}
		}
		return len(dead) == 3
	})
	replay := func(kind string) (int, []byte) {
		return f.call(http.MethodPost, "/v1/dead-letters/"+strconv.FormatInt(dead[kind], 10)+"/replay", nil)
	}
	problemCode := func(body []byte) string {
		var p apiclient.Problem
		json.Unmarshal(body, &p)
		return p.Code
	}
	if st, body := replay("bad"); st != http.StatusUnprocessableEntity || problemCode(body) != "still_invalid" {
		t.Errorf("replay of a body without message_id: %d %s, want 422 still_invalid", st, body)
	}
	if st, body := replay("capped"); st != http.StatusConflict || problemCode(body) != "raw_truncated" {
		t.Errorf("replay of a capped body: %d %s, want 409 raw_truncated", st, body)
	}
	// Under the same cap the body is still too big.
	if st, body := replay("oversize"); st != http.StatusUnprocessableEntity || !strings.Contains(string(body), "oversize") {
		t.Errorf("replay under the old cap: %d %s, want 422 naming oversize", st, body)
	}
	if st, body := f.call(http.MethodPost, "/v1/dead-letters/999999999/replay", nil); st != http.StatusNotFound {
		t.Errorf("replay of an unknown dead letter: %d %s", st, body)
	}

	// The operator raises the cap and restarts the bridge.
	f.start()
	st, body := replay("oversize")
	if st != http.StatusOK {
		t.Fatalf("replay after the cap was raised: %d %s", st, body)
	}
	var ans apiclient.ReplayResult
	testsvc.Must(t, json.Unmarshal(body, &ans), "replay answer")
	if ans.Outcome != "accepted" || ans.EventID == 0 || ans.EventType != "service.update" {
		t.Fatalf("replay answer: %s", body)
	}
	// It took effect: the service is disabled with the long reason.
	f.waitFor(30*time.Second, "the replayed service.update applied", func() bool {
		h, err := f.admin.Host(f.ctx, b.node)
		return err == nil && h.Disabled && h.DisabledReason == long
	})
	// Twice: deduplicated on message_id.
	r2, err := f.admin.ReplayDeadLetter(f.ctx, dead["oversize"])
	testsvc.Must(t, err, "second replay")
	if r2.Outcome != "duplicate" || r2.EventID != ans.EventID {
		t.Errorf("second replay: %s, want duplicate of event %d", r2.Raw, ans.EventID)
	}
	var events int
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM events WHERE message_id = $1`, ans.MessageID).Scan(&events), "events")
	if events != 1 {
		t.Errorf("%d inbox rows of the replayed message, want 1", events)
	}
	var replayedBy string
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT coalesce(replayed_by,'') FROM dead_letters WHERE id = $1`, dead["oversize"]).Scan(&replayedBy), "dead letter")
	if replayedBy != "ops" {
		t.Errorf("dead letter replayed_by %q, want ops", replayedBy)
	}
	al, err := f.admin.Audit(f.ctx, apiclient.AuditFilter{Action: "dead_letter.replay"})
	testsvc.Must(t, err, "audit")
	var outcomes []string
	for _, r := range al.Records {
		var d struct {
			Outcome string `json:"outcome"`
		}
		json.Unmarshal(r.Detail, &d)
		outcomes = append(outcomes, d.Outcome)
	}
	if strings.Join(outcomes, ",") != "still_invalid,refused,still_invalid,accepted,duplicate" {
		t.Errorf("audited replay outcomes %v", outcomes)
	}
}
