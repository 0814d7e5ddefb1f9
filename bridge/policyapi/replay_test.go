package policyapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/policyreplay"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// replayServer serves the policy routes with the sample rules in force,
// static tokens "admin-token" (admin) and "reader-token" (a fleet
// reader), and pool (may be nil).
func replayServer(t testing.TB, pool *pgxpool.Pool) *api.Server {
	t.Helper()
	h, err := policy.NewHolder(policy.Config{
		RulesFile:    "../../etc/vgpu-bridge/rules.yaml",
		ProfilesFile: "../../etc/vgpu-bridge/profiles.yaml",
		CompatFile:   "../../etc/vgpu-bridge/driver-compat.yaml",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("admin-token admin\nreader-token reader\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := api.LoadTokenFile(tokens)
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: auth})
	New(Config{Holder: h, Pool: pool}).Register(srv)
	return srv
}

func postReplay(srv *api.Server, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/policy/replay", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, req)
	return rec
}

func replayBody(t *testing.T, since, until time.Time, rules string, max int) string {
	b, err := json.Marshal(map[string]any{"since": since, "until": until, "rules": rules, "max_events": max})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReplayRefusals: every refusal is problem+json, before anything is
// read (no database here): not an admin, fields missing or wrong, a
// candidate that does not compile (each problem with line and rule), a
// body over the API's limit.
func TestReplayRefusals(t *testing.T) {
	srv := replayServer(t, nil)
	now := time.Now().UTC()
	okRules := "version: 1\nrules: []\n"
	badRules := "version: 1\nrules:\n  - name: scale-up-busy\n    on: [webhook.GPU_LOAD]\n    when: metrics.gpu_util > \"75\"\n    then: ['resize(larger(instance.profile))']\n  - name: typo\n    on: [alert]\n    then: ['atach(\"T4-4Q\", 1)']\n"
	for _, tc := range []struct {
		name, token, body string
		status            int
		want              []string
	}{
		{"reader", "reader-token", replayBody(t, now.Add(-time.Hour), now, okRules, 0), 403, []string{"vgpu:policy:replay"}},
		{"no token", "", replayBody(t, now.Add(-time.Hour), now, okRules, 0), 401, nil},
		{"missing", "admin-token", `{}`, 422, []string{`"name":"since"`, `"name":"until"`, `"name":"rules"`}},
		{"reversed", "admin-token", replayBody(t, now, now.Add(-time.Hour), okRules, 0), 422, []string{"must be after since"}},
		{"too many", "admin-token", replayBody(t, now.Add(-time.Hour), now, okRules, MaxReplayEvents+1), 422, []string{`"name":"max_events"`}},
		{"unknown field", "admin-token", `{"since": "2026-01-01T00:00:00Z", "untill": "x"}`, 422, []string{"untill"}},
		{"bad rules", "admin-token", replayBody(t, now.Add(-time.Hour), now, badRules, 0), 422, []string{
			`5:28: rule \"scale-up-busy\": when: found no matching overload for '_>_'`, `9:18: rule \"typo\": then: undeclared reference to 'atach'`, "do not compile: 2 problem(s)"}},
		{"too large", "admin-token", replayBody(t, now.Add(-time.Hour), now, "# "+strings.Repeat("x", 2<<20), 0), 413, nil},
		{"no database", "admin-token", replayBody(t, now.Add(-time.Hour), now, okRules, 0), 503, []string{"database"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := postReplay(srv, tc.token, tc.body)
			if rec.Code != tc.status || rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("status %d (%s), want %d problem+json: %s", rec.Code, rec.Header().Get("Content-Type"), tc.status, rec.Body)
			}
			for _, w := range tc.want {
				if !strings.Contains(rec.Body.String(), w) {
					t.Errorf("answer lacks %s: %s", w, rec.Body)
				}
			}
		})
	}
}

// TestReplayOverAPI replays a recorded request and release with a
// candidate that has no release rule: both attach for the request; the
// rules in force reject the release (the instance holds no vGPU) and the
// candidate decides nothing, a difference in rejections.
func TestReplayOverAPI(t *testing.T) {
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	ctx := context.Background()
	since := time.Now().Add(-time.Second)
	vm := uuid.New()
	b := &pgx.Batch{} // the inbox rows as the webhook endpoint writes them
	for i, p := range []string{
		fmt.Sprintf(`{"source":"ops","type":"GPU_REQUEST","vm_id":%q,"vgpu_profile":"T4-2Q"}`, vm),
		fmt.Sprintf(`{"source":"ops","type":"GPU_RELEASE","vm_id":%q}`, vm),
	} {
		typ := []string{"GPU_REQUEST", "GPU_RELEASE"}[i]
		b.Queue(`INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, request_id, project_id)
			VALUES ('webhook:ops', $1, $2, $3, $4, $5::json, $6, 'p1')`, uuid.NewString(), typ, vm, time.Now(), p, uuid.NewString())
	}
	testsvc.Must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE events SET processed_at = now()`)
		return err
	}), "record")
	srv := replayServer(t, pool)
	// The candidate releases nothing.
	candidate := `version: 1
rules:
  - name: explicit-request
    on: [webhook.GPU_REQUEST]
    when: preferred != ""
    then: ['attach(preferred, 1)']
`
	rec := postReplay(srv, "admin-token", replayBody(t, since, time.Now().Add(time.Second), candidate, 0))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var doc struct {
		Events  []policyreplay.Event `json:"events"`
		Summary policyreplay.Summary `json:"summary"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	if len(doc.Events) != 2 || doc.Summary.Evaluated != 2 || doc.Summary.Differing != 1 || doc.Summary.Differ["reject"] != 1 || doc.Summary.Differ["release"] != 0 ||
		doc.Summary.Differ["attach"] != 0 || doc.Summary.MaxEvents != DefaultReplayEvents {
		t.Fatalf("replay = %s", rec.Body)
	}
	if ev := doc.Events[0]; ev.Kind != "webhook.GPU_REQUEST" || len(ev.Differs) != 0 || len(ev.Active.Intents) != 1 || ev.Active.Intents[0].Profile != "T4-2Q" {
		t.Errorf("request event = %+v", ev)
	}
	if ev := doc.Events[1]; ev.Kind != "webhook.GPU_RELEASE" || !ev.Active.Rejected || ev.Candidate.Rejected || len(ev.Candidate.Intents) != 0 {
		t.Errorf("release event = %+v", ev)
	}
}

// FuzzReplayRequest: whatever the body, the replay route answers a
// problem (no database here, so at best 503) and never panics; a body that
// reaches the database is a valid window with rules that compile.
func FuzzReplayRequest(f *testing.F) {
	f.Add(`{"since": "2026-12-05T00:00:00Z", "until": "2026-12-06T00:00:00Z", "rules": "version: 1\nrules: []\n"}`)
	f.Add(`{"since": "2026-12-05T00:00:00Z", "until": "2026-12-06T00:00:00Z", "rules": "rules:\n  - name: x\n    on: [alert]\n    then: [atach(1)]\n", "max_events": 5}`)
	f.Add(`{"since": "2026-12-06T00:00:00Z", "until": "2026-12-05T00:00:00Z", "rules": "x"}`)
	f.Add(`{"rules": null, "max_events": -1}`)
	f.Add(`[]`)
	srv := replayServer(f, nil)
	f.Fuzz(func(t *testing.T, body string) {
		rec := postReplay(srv, "admin-token", body)
		if rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("status %d, %s: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
		if rec.Code == http.StatusServiceUnavailable {
			var req replayRequest
			if json.Unmarshal([]byte(body), &req) != nil || req.Since == nil || req.Until == nil || !req.Since.Before(*req.Until) || req.Rules == nil {
				t.Fatalf("reached the database with %q", body)
			}
			if _, err := policy.Load(strings.NewReader(*req.Rules), policy.Options{}); err != nil && !strings.Contains(err.Error(), "catalog") {
				t.Fatalf("reached the database with rules that do not compile: %v", err)
			}
		} else if rec.Code >= 500 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	})
}
