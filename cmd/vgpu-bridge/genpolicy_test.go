package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A policy file that does not parse stops the bridge before it starts
// anything, and `config check` says which line of which file, and why.
func TestBrokenPolicyFileRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(bad, []byte("# ops may drain\n\"vgpu:hosts:drain\": \"rule:admin or (role:vgpu-maintainer\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"config", "check"}, {"serve"}} {
		code, _, errOut := runCmd(t, append(cmd, "--config", "", "--set", "oslo_policy.policy_file="+bad)...)
		if code != 2 {
			t.Fatalf("%v: exit %d, want 2; stderr:\n%s", cmd, code, errOut)
		}
		for _, want := range []string{"[oslo_policy] policy_file", bad, `line 2: rule "vgpu:hosts:drain": a ( is not closed`} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%v: stderr lacks %q:\n%s", cmd, want, errOut)
			}
		}
	}
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("\"vgpu:hosts:drain\": \"rule:admin or role:vgpu-maintainer\"\n"), 0o600)
	// (Without a database or RabbitMQ the configuration is bad anyway;
	// the policy file is not among its problems.)
	if _, _, errOut := runCmd(t, "config", "check", "--config", "", "--set", "oslo_policy.policy_file="+good); strings.Contains(errOut, "oslo_policy") {
		t.Errorf("config check finds fault with a good policy file:\n%s", errOut)
	}
}

func TestGenpolicy(t *testing.T) {
	code, out, errOut := runCmd(t, "genpolicy", "--config", "")
	if code != 0 || !strings.Contains(out, `#"vgpu:hosts:drain": "rule:maintenance"`) ||
		!strings.Contains(out, "# POST    /v1/hosts/{name}/drain") {
		t.Errorf("genpolicy: exit %d, stderr %s, out:\n%s", code, errOut, out)
	}
	if code, _, errOut := runCmd(t, "genpolicy", "--config", "", "--format", "json"); code != 2 {
		t.Errorf("genpolicy --format json: exit %d (%s), want a usage error", code, errOut)
	}
}
