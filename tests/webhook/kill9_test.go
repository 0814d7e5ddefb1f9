package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestKill9DuringWebhookBurst: 32 senders post 3,000 signed webhooks to a
// whole vgpu-bridge (a subprocess) while it is killed with SIGKILL three
// times and started again. A sender retries each request, with its own
// Idempotency-Key, until it gets 202. Every request answered 202 is
// stored exactly once: none lost across the kills, none doubled by the
// retries.
func TestKill9DuringWebhookBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("3,000 webhooks")
	}
	const n, senders = 3000, 32
	dbURL := testsvc.MigratedPostgres(t)
	pool := testsvc.Pool(t, dbURL)
	dir := t.TempDir()
	secret := filepath.Join(dir, "burst.secret")
	testsvc.Must(t, os.WriteFile(secret, secretNew, 0o600), "secret")
	file := filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(file, []byte("[webhook_source:burst]\nauth = hmac\nsecret_files = "+secret+"\nrate = 100000\nburst = 100000\n"), 0o600), "config")
	proc := testbridge.NewProc(t, dbURL, file)
	proc.Start()

	var next, accepted, retries atomic.Int64
	ids := make([]string, n)
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: 10 * time.Second}
	began := time.Now()
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				body := []byte(fmt.Sprintf(`{"type":"GPU_LOAD","vm_id":"%s","metrics":{"seq":%d}}`, uuid.NewString(), i))
				key := fmt.Sprintf("burst-%d", i)
				for attempt := 0; ; attempt++ {
					req, _ := http.NewRequest(http.MethodPost, proc.URL()+"/v1/webhooks/burst", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Hub-Signature-256", hubSign(secretNew, body))
					req.Header.Set("Idempotency-Key", key)
					resp, err := hc.Do(req)
					if err == nil {
						var a struct {
							RequestID string `json:"request_id"`
						}
						json.NewDecoder(resp.Body).Decode(&a)
						resp.Body.Close()
						if resp.StatusCode == http.StatusAccepted {
							ids[i] = a.RequestID
							accepted.Add(1)
							break
						}
					}
					retries.Add(1)
					if attempt > 600 {
						t.Errorf("request %d: no 202 after %d attempts", i, attempt)
						return
					}
					time.Sleep(50 * time.Millisecond) // the bridge is down or starting
				}
			}
		}()
	}
	for _, at := range []int64{n / 5, n / 2, 4 * n / 5} {
		deadline := time.Now().Add(2 * time.Minute)
		for accepted.Load() < at && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		proc.Kill9()
		proc.Start()
	}
	wg.Wait()
	elapsed := time.Since(began)
	var total, distinct, missing int
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT idempotency_key) FROM requests WHERE source = 'webhook:burst'`).
		Scan(&total, &distinct), "requests")
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM unnest($1::uuid[]) AS a(id) WHERE NOT EXISTS (SELECT 1 FROM requests r WHERE r.id = a.id)`,
		ids).Scan(&missing), "answered and missing")
	proc.Kill9()
	t.Logf("sent %d, answered 202 %d (%d retries across 3 × kill -9), stored %d, lost %d, doubled %d; %.1f s; peak RSS per process %v",
		n, accepted.Load(), retries.Load(), distinct, missing, total-distinct, elapsed.Seconds(), proc.Peaks)
	if accepted.Load() != n || distinct != n || total != n || missing != 0 {
		t.Errorf("answered %d, stored %d distinct of %d, %d answered but missing; want %d each once\n%s", accepted.Load(), distinct, total, missing, n, proc.Log(30))
	}
}
