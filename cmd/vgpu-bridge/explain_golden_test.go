package main

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/explain")

// policyHash is the shipped policy's hash in explain's first line: it
// changes with every edit of the file, the decisions do not.
var policyHash = regexp.MustCompile(`\(policy [0-9a-f]{16}\)`)

// TestExplainShippedRules: each shipped rule, on the event it is for,
// explains as its golden file says (go test -run TestExplainShippedRules
// -update rewrites them): the load rules start holding on an alert whose
// metrics cross their line and not on a resolved one, the tuning rule
// fires on bridge.vgpu_changed, a too-new guest driver is refused citing
// the branch rule.
func TestExplainShippedRules(t *testing.T) {
	events, err := filepath.Glob("testdata/explain/*.json")
	if err != nil || len(events) == 0 {
		t.Fatalf("no events in testdata/explain: %v", err)
	}
	for _, ev := range events {
		name := strings.TrimSuffix(filepath.Base(ev), ".json")
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCmd(t, "policy", "explain", "--config", "", "--policy", filepath.Join(etcDir, "rules.yaml"), "--event", ev)
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, errOut)
			}
			out = policyHash.ReplaceAllString(out, "(policy HASH)")
			golden := strings.TrimSuffix(ev, ".json") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run TestExplainShippedRules -update to write it)", err)
			}
			if out != string(want) {
				t.Errorf("explain of %s differs from %s:\n--- got\n%s\n--- want\n%s", ev, golden, out, want)
			}
		})
	}
}
