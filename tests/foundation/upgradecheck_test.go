package foundation

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/migrations"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestUpgradeCheck runs `vgpu-bridge upgrade check` as an operator would,
// against the real Postgres and Placement: it exits 2 on an old schema, 1
// with only warnings (no notification, no agent yet), 2 naming a GPU
// provider that has no type trait and no agent reporting it, and 1 again
// once an agent reports that GPU.
func TestUpgradeCheck(t *testing.T) {
	ctx := context.Background()
	db := testsvc.Postgres(t)
	pool := testsvc.Pool(t, db)
	bin := testsvc.Binary(t, "vgpu-bridge")
	run := func(wantExit int, db string, extra []string, want ...string) string {
		t.Helper()
		args := append([]string{"upgrade", "check", "--config", ""}, extra...)
		for _, s := range testbridge.Overrides(t, db) {
			args = append(args, "--set", s)
		}
		out, err := exec.Command(bin, args...).CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != wantExit {
			t.Errorf("exit %d, want %d:\n%s", code, wantExit, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("output lacks %q:\n%s", w, out)
			}
		}
		return string(out)
	}
	check := func(wantExit int, want ...string) string {
		t.Helper()
		return run(wantExit, db, nil, want...)
	}

	// One migration short of the current schema.
	files, err := fs.Glob(migrations.FS, "*.sql")
	testsvc.Must(t, err, "migrations")
	_, err = store.MigrateTo(ctx, pool, int64(len(files)-1), nil)
	testsvc.Must(t, err, "migrate to the schema before the current one")
	check(2, "Database schema", "1 migration(s) pending: run vgpu-bridge migrate up")

	_, err = store.Migrate(ctx, pool, nil)
	testsvc.Must(t, err, "migrate")
	check(1, "Nova versioned notifications  Warning", "notification_format = versioned", "Placement API", "Success",
		"no agent has reported yet", "Signing keys")

	// A GPU provider in the mirror without its type trait.
	root, gpu := uuid.NewString(), uuid.NewString()
	_, err = pool.Exec(ctx, `INSERT INTO placement_providers (uuid, name, generation, root_uuid) VALUES
		($1, 'cmp-untyped', 1, $1), ($2, 'cmp-untyped_pci_0000_3b_00_0', 1, $1)`, root, gpu)
	testsvc.Must(t, err, "mirror providers")
	_, err = pool.Exec(ctx, `INSERT INTO placement_inventories (provider_uuid, resource_class, total, max_unit) VALUES ($1, 'VGPU', 4, 4)`, gpu)
	testsvc.Must(t, err, "mirror inventory")
	check(2, "GPU providers typed", "reported by no agent: cmp-untyped_pci_0000_3b_00_0")

	// Its host's agent reports the GPU and its types: a warning.
	_, err = pool.Exec(ctx, `INSERT INTO hosts (name, node, agent_version, last_report_at, report) VALUES ('cmp-untyped', 'cmp-untyped', 'test', now(),
		'{"v": 1, "minor": 1, "host": "cmp-untyped", "node": "cmp-untyped", "gpus": [{"pci": "0000:3b:00.0", "health": "ok", "active": [],
		  "types": [{"id": "nvidia-232", "name": "GRID T4-4Q", "max_instances": 4, "available_instances": 4}]}]}')`)
	testsvc.Must(t, err, "host report")
	out := check(1, "typed from their agents' reports", "cmp-untyped_pci_0000_3b_00_0", "1 agent(s) on protocol 1.1")
	if strings.Contains(out, "Failure") {
		t.Errorf("a failure left:\n%s", out)
	}

	// --json: oslo.upgradecheck's document, each result its exit code.
	out = run(1, db, []string{"--json"})
	var doc struct {
		Name   string
		Checks []struct {
			Check   string
			Result  int
			Details string
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Name == "" || len(doc.Checks) != 6 {
		t.Fatalf("--json = %v %q", err, out)
	}
	results := map[string]int{}
	for _, c := range doc.Checks {
		results[c.Check] = c.Result
	}
	if results["Database schema"] != 0 || results["GPU providers typed"] != 1 {
		t.Errorf("--json results %v, want the schema 0 (success) and the providers 1 (warning)", results)
	}

	// No database to check against: the checks could not run.
	run(255, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", nil, "cannot reach the database")
}
