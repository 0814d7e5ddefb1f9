package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestPolicyReplayRefusesBadCandidate: a candidate that does not compile
// is refused with its file, line, column and rule, before the database is
// touched (none is configured here).
func TestPolicyReplayRefusesBadCandidate(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "candidate.yaml")
	doc := "version: 1\nrules:\n  - name: scale-up-busy\n    on: [webhook.GPU_LOAD]\n    when: metrics.gpu_util > \"75\"\n    then: ['resize(larger(instance.profile))']\n"
	if err := os.WriteFile(bad, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad rules", []string{"--rules", bad, "--since", "24h"}, bad + `:5:28: rule "scale-up-busy": when: found no matching overload for '_>_'`},
		{"no rules", []string{"--since", "24h"}, "--rules CANDIDATE.yaml is required"},
		{"bad since", []string{"--rules", bad, "--since", "yesterday"}, `--since: "yesterday": want an RFC 3339 time`},
		{"bad output", []string{"--rules", bad, "--since", "1h", "-o", "yaml"}, `-o "yaml": want table or json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"policy", "replay", "--config", "", "--policy", filepath.Join(etcDir, "rules.yaml")}, tc.args...)
			code, out, errOut := runCmd(t, args...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, want 2 with %q\nstdout %s\nstderr %s", code, tc.want, out, errOut)
			}
		})
	}
}

// TestPolicyReplayEmptyWindow runs the command against a real database:
// the sample rules against themselves over a window with no event.
func TestPolicyReplayEmptyWindow(t *testing.T) {
	url := testsvc.MigratedPostgres(t)
	rules := filepath.Join(etcDir, "rules.yaml")
	for _, o := range []string{"table", "json"} {
		code, out, errOut := runCmd(t, "policy", "replay", "--config", "", "--set", "database.connection="+url,
			"--set", "DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:5672/", "--set", "api.auth_strategy=noauth",
			"--policy", rules, "--rules", rules, "--since", "2h", "--until", "1h", "-o", o)
		if code != 0 {
			t.Fatalf("-o %s: exit %d\n%s%s", o, code, out, errOut)
		}
		want := "events: 0 read, 0 evaluated, 0 failed, 0 differ"
		if o == "json" {
			want = `"events": [],`
		}
		if !strings.Contains(out, want) {
			t.Errorf("-o %s: output lacks %q:\n%s", o, want, out)
		}
	}
}
