package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

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
	const n, senders = 3000, 32
	dbURL := testsvc.MigratedPostgres(t)
	pool := testsvc.Pool(t, dbURL)
	proc := testbridge.NewProc(t, dbURL, burstConfig(t))
	proc.Start()

	b := startBurst(t, proc.URL(), n, senders)
	for _, at := range []int64{n / 5, n / 2, 4 * n / 5} {
		b.waitAccepted(at)
		proc.Kill9()
		proc.Start()
	}
	b.wg.Wait()
	stored, lost, doubled := b.check(pool)
	proc.Kill9()
	t.Logf("sent %d, answered 202 %d (%d retries across 3 × kill -9), stored %d, lost %d, doubled %d; %.1f s; peak RSS per process %v",
		n, b.accepted.Load(), b.retries.Load(), stored, lost, doubled, time.Since(b.began).Seconds(), proc.Peaks)
	if b.accepted.Load() != n || stored != n || lost != 0 || doubled != 0 {
		t.Errorf("answered %d, stored %d, lost %d, doubled %d; want %d each once\n%s", b.accepted.Load(), stored, lost, doubled, n, proc.Log(30))
	}
}

// burst is senders posting n signed webhooks to source burst, each
// retried under its own Idempotency-Key until it gets 202.
type burst struct {
	next, accepted, retries atomic.Int64
	ids                     []string
	wg                      sync.WaitGroup
	began                   time.Time
}

func startBurst(t *testing.T, base string, n, senders int) *burst {
	b := &burst{ids: make([]string, n), began: time.Now()}
	hc := &http.Client{Timeout: 10 * time.Second}
	for range senders {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for {
				i := int(b.next.Add(1) - 1)
				if i >= n {
					return
				}
				body := []byte(fmt.Sprintf(`{"type":"GPU_LOAD","vm_id":"%s","metrics":{"seq":%d}}`, uuid.NewString(), i))
				key := fmt.Sprintf("burst-%d", i)
				for attempt := 0; ; attempt++ {
					req, _ := http.NewRequest(http.MethodPost, base+"/v1/webhooks/burst", bytes.NewReader(body))
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
							b.ids[i] = a.RequestID
							b.accepted.Add(1)
							break
						}
					}
					b.retries.Add(1)
					if attempt > 1200 {
						t.Errorf("request %d: no 202 after %d attempts", i, attempt)
						return
					}
					time.Sleep(50 * time.Millisecond) // the bridge or its database is down
				}
			}
		}()
	}
	return b
}

func (b *burst) waitAccepted(at int64) {
	deadline := time.Now().Add(2 * time.Minute)
	for b.accepted.Load() < at && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// check counts the burst's requests stored, the answered ones missing and
// the ones stored twice.
func (b *burst) check(pool *pgxpool.Pool) (stored, lost, doubled int) {
	var total int
	ctx := context.Background()
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT idempotency_key) FROM requests WHERE source = 'webhook:burst'`).Scan(&total, &stored); err != nil {
		return -1, -1, -1
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::uuid[]) AS a(id) WHERE NOT EXISTS (SELECT 1 FROM requests r WHERE r.id = a.id)`,
		b.ids).Scan(&lost); err != nil {
		return -1, -1, -1
	}
	return stored, lost, total - stored
}

// burstConfig writes a configuration file with the burst source.
func burstConfig(t *testing.T) string {
	dir := t.TempDir()
	secret := filepath.Join(dir, "burst.secret")
	testsvc.Must(t, os.WriteFile(secret, secretNew, 0o600), "secret")
	file := filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(file, []byte("[webhook_source:burst]\nauth = hmac\nsecret_files = "+secret+"\nrate = 100000\nburst = 100000\n"), 0o600), "config")
	return file
}

// TestPostgresRestartDuringWebhookBurst stops and starts a private Postgres
// cluster under the bridge during a burst: /readyz turns 503 naming the
// database, the bridge recovers by itself once it is back, and every
// request answered 202 is stored once (the senders retry what got 503
// or no answer).
func TestPostgresRestartDuringWebhookBurst(t *testing.T) {
	const n, senders = 1500, 16
	pg := testsvc.NewPrivatePostgres(t)
	proc := testbridge.NewProc(t, pg.URL, burstConfig(t), "database.connect_timeout=1s")
	proc.Start()
	pool := testsvc.Pool(t, pg.URL)
	b := startBurst(t, proc.URL(), n, senders)
	b.waitAccepted(n / 3)
	pool.Close()
	pg.Stop()
	down := time.Now()
	detail := proc.WaitReadyz(http.StatusServiceUnavailable, 20*time.Second)
	if !strings.Contains(detail, "database") {
		t.Errorf("/readyz while Postgres is down: %q, want it to name the database", detail)
	}
	accepted := b.accepted.Load()
	time.Sleep(2 * time.Second) // senders keep trying meanwhile
	if got := b.accepted.Load(); got > accepted+int64(senders) {
		t.Errorf("%d requests answered 202 while Postgres was down", got-accepted)
	}
	pg.Start()
	proc.WaitReadyz(http.StatusOK, time.Minute)
	recovered := time.Since(down)
	b.wg.Wait()
	pool = testsvc.Pool(t, pg.URL)
	stored, lost, doubled := b.check(pool)
	t.Logf("sent %d, answered 202 %d (%d retries), stored %d, lost %d, doubled %d; Postgres down and ready again in %.1f s; peak RSS %s",
		n, b.accepted.Load(), b.retries.Load(), stored, lost, doubled, recovered.Seconds(), proc.PeakNow())
	if b.accepted.Load() != n || stored != n || lost != 0 || doubled != 0 {
		t.Errorf("answered %d, stored %d, lost %d, doubled %d; want %d each once\n%s", b.accepted.Load(), stored, lost, doubled, n, proc.Log(30))
	}
}
