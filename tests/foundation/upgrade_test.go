package foundation

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// releasedSchema is the last migration of main when upgrades became a
// tested promise: every later migration must carry a database at this
// schema, with data, forward (testdata/upgrade/00015.sql).
const releasedSchema = 15

// TestUpgradeKeepsData: a database stood at an earlier schema and filled
// as a bridge of that release leaves it (testdata/upgrade/NNNNN.sql) is
// migrated to the current schema; the data is all there, and a bridge on
// it serves it.
func TestUpgradeKeepsData(t *testing.T) {
	seeds, err := filepath.Glob("testdata/upgrade/*.sql")
	testsvc.Must(t, err, "seeds")
	var versions []int64
	for _, s := range seeds {
		v, err := strconv.ParseInt(strings.TrimSuffix(filepath.Base(s), ".sql"), 10, 64)
		testsvc.Must(t, err, "seed name "+s)
		versions = append(versions, v)
	}
	if len(versions) == 0 || versions[len(versions)-1] != releasedSchema {
		t.Fatalf("seeds %v: the released schema %05d needs testdata/upgrade/%05d.sql", versions, releasedSchema, releasedSchema)
	}
	for i, v := range versions {
		t.Run(fmt.Sprintf("from %05d", v), func(t *testing.T) {
			ctx := context.Background()
			db := testsvc.Postgres(t)
			pool := testsvc.Pool(t, db)
			if _, err := store.MigrateTo(ctx, pool, v, nil); err != nil {
				t.Fatalf("migrate to %d: %v", v, err)
			}
			seed, err := os.ReadFile(seeds[i])
			testsvc.Must(t, err, "read seed")
			if _, err := pool.Exec(ctx, string(seed)); err != nil {
				t.Fatalf("seed at %05d: %v", v, err)
			}
			if _, err := store.Migrate(ctx, pool, nil); err != nil {
				t.Fatalf("migrate from %05d to the current schema: %v", v, err)
			}

			for _, c := range []struct{ what, query, want string }{
				{"host report", `SELECT report->'gpus'->0->'active'->0->>'mdev_uuid' FROM hosts WHERE name = 'cmp-up-1'`, "4b20d080-1b54-4048-85b3-a6a62d165c01"},
				{"instance", `SELECT vm_state || ' ' || host || ' ' || (flavor->>'name') FROM instances WHERE uuid = '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01'`, "active cmp-up-1 m1.large"},
				{"request", `SELECT state || ' ' || reason FROM requests WHERE id = '7e0c2a52-9d1b-4a9a-8f5e-0c2d3b4a5f01'`, "succeeded attached T4-4Q"},
				{"decision", `SELECT policy FROM decisions WHERE event_id = 9001`, "sha256:up"},
				{"event", `SELECT event_type || ' ' || (payload->>'vgpu_profile') || ' ' || pg_typeof(payload)::text FROM events WHERE id = 9001`, "GPU_REQUEST T4-4Q json"},
				{"command", `SELECT kind || ' ' || result_status FROM commands WHERE id = 'a1b2c3d4-0000-4000-8000-000000000001'`, "attach_vgpu succeeded"},
				{"attachment", `SELECT state || ' ' || profile || ' ' || frame_rate_limit FROM vgpu_attachments WHERE id = '4b20d080-1b54-4048-85b3-a6a62d165c01'`, "attached T4-4Q true"},
				{"load window", `SELECT jsonb_array_length(samples)::text FROM instance_load WHERE instance_uuid = '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01'`, "2"},
				{"audit", `SELECT action || ' ' || (detail->>'profile') FROM audit_log WHERE object_id = '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01'`, "attach T4-4Q"},
			} {
				var got string
				if err := pool.QueryRow(ctx, c.query).Scan(&got); err != nil || got != c.want {
					t.Errorf("%s after the upgrade = %q (%v), want %q", c.what, got, err, c.want)
				}
			}

			// The bridge of this release serves what the old one left.
			d := start(t, config(t, db))
			code, body := get(t, "http://"+d.API.Addr()+"/v1/requests/7e0c2a52-9d1b-4a9a-8f5e-0c2d3b4a5f01", testbridge.AdminToken)
			var r struct {
				State        string `json:"state"`
				InstanceUUID string `json:"instance_uuid"`
			}
			if err := json.Unmarshal([]byte(body), &r); code != 200 || err != nil || r.State != "succeeded" ||
				r.InstanceUUID != "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01" {
				t.Errorf("GET the upgraded request = %d %s", code, body)
			}
		})
	}
}
