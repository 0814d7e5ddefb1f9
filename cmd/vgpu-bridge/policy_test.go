package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const etcDir = "../../etc/vgpu-bridge"

func TestPolicyCheckSample(t *testing.T) {
	code, out, errOut := runCmd(t, "policy", "check", "--config", "", filepath.Join(etcDir, "rules.yaml"))
	if code != 0 || !strings.Contains(out, "OK: 10 rule(s)") || !strings.Contains(out, "driver-compat.yaml") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}

func TestPolicyCheckReportsEveryProblemWithPosition(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "policy.yaml")
	doc := "rules:\n  - name: x\n    on: [alert]\n    when: metrics.gpu_util > \"a\"\n    then: [attach(1)]\nprofiles:\n  T9-4Q: {}\n"
	if err := os.WriteFile(bad, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "policy", "check", "--config", "", "--profiles", filepath.Join(etcDir, "profiles.yaml"), bad)
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		bad + `:4:28: rule "x": when: found no matching overload for '_>_' applied to '(double, string)'`,
		bad + `:5:18: rule "x": then: found no matching overload for 'attach'`,
		bad + `:7:3: profile T9-4Q is not in the profile catalog`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "3 problem(s)") {
		t.Errorf("stderr %q", errOut)
	}
}

func TestPolicyCheckBrokenCompatFile(t *testing.T) {
	dir := t.TempDir()
	compat := filepath.Join(dir, "driver-compat.yaml")
	if err := os.WriteFile(compat, []byte("branches: [470, 460]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCmd(t, "policy", "check", "--config", "", "--compat", compat, filepath.Join(etcDir, "rules.yaml"))
	if code != 2 || !strings.Contains(out, compat+":1:17: branches must be listed oldest first") {
		t.Fatalf("exit %d\n%s", code, out)
	}
}

func TestPolicyExplain(t *testing.T) {
	code, out, errOut := runCmd(t, "policy", "explain", "--config", "", "--policy", filepath.Join(etcDir, "rules.yaml"), "--event", "testdata/explain-event.json")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	for _, want := range []string{
		"event webhook.GPU_REQUEST instance vm1 project p1 at 2025-03-01T12:00:00Z",
		"preferred profile: T4-16C (workload training: largest of series C that fits)",
		"attach T4-16C x1 mode=nova-resize trait=CUSTOM_NVIDIA_321 [rule explicit-request]",
		`fired    vm-limits-for-training`,
		`false    request-without-fit`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = runCmd(t, "policy", "explain", "--config", "", "--policy", filepath.Join(etcDir, "rules.yaml"), "--event", "testdata/explain-event.json", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	var d struct {
		Intents []struct{ Kind, Profile string }
		Rules   []struct{ Rule, Outcome string }
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(d.Intents) != 2 || d.Intents[0].Profile != "T4-16C" || len(d.Rules) == 0 {
		t.Errorf("json = %+v", d)
	}
}

func TestPolicyExplainNeedsEvent(t *testing.T) {
	code, _, errOut := runCmd(t, "policy", "explain", "--config", "", "--policy", filepath.Join(etcDir, "rules.yaml"))
	if code != 2 || !strings.Contains(errOut, "--event FILE is required") {
		t.Fatalf("exit %d %q", code, errOut)
	}
}
