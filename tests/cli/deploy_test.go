package cli

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// unitDirectives reads a systemd unit as "Section.Key" -> values.
func unitDirectives(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Errorf("%s: not KEY=VALUE: %q", path, line)
				continue
			}
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	return out
}

func TestSystemdUnits(t *testing.T) {
	dir := "../../etc/systemd"
	want := map[string]map[string]string{
		"vgpu-bridge.service": {
			"Service.User": "vgpu-bridge", "Service.NoNewPrivileges": "yes", "Service.ProtectSystem": "strict",
			"Service.PrivateTmp": "yes", "Service.ProtectHome": "yes", "Service.CapabilityBoundingSet": "",
			"Service.Restart": "on-failure", "Service.ExecReload": "/bin/kill -HUP $MAINPID",
			"Service.StandardError": "journal", "Service.PrivateDevices": "yes", "Service.ProtectKernelTunables": "yes",
			"Unit.Wants": "network-online.target vgpu-bridge-migrate.service",
			// Readiness and watchdog (internal/daemon, tests/operations).
			"Service.Type": "notify", "Service.NotifyAccess": "main", "Service.WatchdogSec": "60s",
		},
		"vgpu-bridge-migrate.service": {
			"Service.Type": "oneshot", "Service.User": "vgpu-bridge", "Service.NoNewPrivileges": "yes",
			"Service.ProtectSystem": "strict", "Service.CapabilityBoundingSet": "", "Unit.Before": "vgpu-bridge.service",
		},
		// Before libvirtd: the guests it starts at boot need their mdevs
		// (tests/lab's TestLabRestartRecreatesMdevsBeforeGuests).
		"vgpu-agent-restore.service": {
			"Service.Type": "oneshot", "Service.User": "root", "Service.NoNewPrivileges": "yes",
			"Service.ProtectSystem": "strict", "Service.StateDirectory": "vgpu-bridge/agent",
			"Service.CapabilityBoundingSet": "CAP_SYS_ADMIN CAP_DAC_OVERRIDE",
			"Unit.Before":                   "libvirtd.service virtqemud.service libvirt-guests.service nova-compute.service vgpu-agent.service",
		},
		// After the driver's modules, before nova-compute: Nova's resource
		// tracker finds the VFs enabled and typed.
		"vgpu-agent-layout.service": {
			"Service.Type": "oneshot", "Service.RemainAfterExit": "yes", "Service.User": "root", "Service.NoNewPrivileges": "yes",
			"Service.ProtectSystem": "strict", "Service.CapabilityBoundingSet": "CAP_SYS_ADMIN CAP_DAC_OVERRIDE",
			"Service.ExecStart": "/usr/bin/vgpu-agent layout apply --config /etc/vgpu-bridge/agent.conf",
			"Unit.After":        "local-fs.target systemd-modules-load.service nvidia-vgpu-mgr.service nvidia-vgpud.service",
			"Unit.Before":       "nova-compute.service libvirtd.service virtqemud.service libvirt-guests.service vgpu-agent-restore.service vgpu-agent.service",
			"Install.WantedBy":  "multi-user.target",
		},
		"vgpu-agent.service": {
			"Unit.Wants":   "network-online.target vgpu-agent-restore.service",
			"Service.User": "root", "Service.NoNewPrivileges": "yes", "Service.ProtectSystem": "strict",
			"Service.CapabilityBoundingSet": "CAP_SYS_ADMIN CAP_DAC_OVERRIDE", "Service.StateDirectory": "vgpu-bridge/agent",
			"Service.Restart": "on-failure", "Service.ExecReload": "/bin/kill -HUP $MAINPID", "Service.StandardError": "journal",
			"Service.Type": "notify", "Service.NotifyAccess": "main", "Service.WatchdogSec": "60s",
		},
	}
	for name, keys := range want {
		d := unitDirectives(t, filepath.Join(dir, name))
		for k, v := range keys {
			if got := d[k]; len(got) != 1 || got[0] != v {
				t.Errorf("%s: %s = %q, want %q", name, k, got, v)
			}
		}
		// The agent's unit must leave /sys, cgroups and /dev usable.
		if strings.HasPrefix(name, "vgpu-agent") {
			for _, k := range []string{"Service.ProtectKernelTunables", "Service.ProtectControlGroups", "Service.PrivateDevices"} {
				if v := d[k]; len(v) > 0 && v[0] == "yes" {
					t.Errorf("%s: %s=yes would stop the agent working", name, k)
				}
			}
		}
		if !strings.Contains(d["Service.ExecStart"][0], "--config /etc/vgpu-bridge/") {
			t.Errorf("%s: ExecStart %q names no config file", name, d["Service.ExecStart"])
		}
	}

	// systemd's own check, with the binaries replaced by one that exists.
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: the structural checks above ran, systemd's verify did not")
		return
	}
	tmp := t.TempDir()
	for name := range want {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		s := strings.NewReplacer("/usr/bin/vgpu-bridge", binPath, "/usr/bin/vgpu-agent", binPath).Replace(string(b))
		writeFile(t, tmp, name, s)
	}
	for name := range want {
		out, err := exec.Command(sa, "verify", "--man=no", filepath.Join(tmp, name)).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
	}
}

// exportedMetrics collects the metric names the Go code registers under
// bridge/ and agent/: string literals naming vgpu_bridge_*, vgpu_agent_*
// and DCGM_FI_* metrics, and `ns + "suffix"` with a const ns prefix.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"((?:vgpu_(?:bridge|agent)_|DCGM_FI_)[A-Za-z0-9_]+)"`)
	nsDecl := regexp.MustCompile(`const ns = "([a-z0-9_]+)"`)
	nsUse := regexp.MustCompile(`ns \+ "([a-z0-9_]+)"`)
	names := map[string]bool{}
	for _, root := range []string{"../../bridge", "../../agent"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			src := string(b)
			for _, m := range lit.FindAllStringSubmatch(src, -1) {
				if !strings.HasSuffix(m[1], "_") {
					names[m[1]] = true
				}
			}
			if ns := nsDecl.FindStringSubmatch(src); ns != nil {
				for _, m := range nsUse.FindAllStringSubmatch(src, -1) {
					names[ns[1]+m[1]] = true
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return names
}

// The dashboard uses only metrics the code exports (and Prometheus's up).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../etc/grafana/vgpu-bridge.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || len(d.Panels) < 20 {
		t.Fatalf("dashboard uid %q, %d panels", d.UID, len(d.Panels))
	}
	exported := exportedMetrics(t)
	if len(exported) < 30 {
		t.Fatalf("found only %d exported metrics in the code: the scan is broken", len(exported))
	}
	ref := regexp.MustCompile(`\b(?:vgpu_(?:bridge|agent)_|DCGM_FI_)[A-Za-z0-9_]+`)
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, pair := range []string{"()", "{}", "[]"} {
				if strings.Count(tg.Expr, pair[:1]) != strings.Count(tg.Expr, pair[1:]) {
					t.Errorf("panel %q %s: unbalanced %s in %s", p.Title, tg.RefID, pair, tg.Expr)
				}
			}
			for _, m := range ref.FindAllString(tg.Expr, -1) {
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if s, ok := strings.CutSuffix(m, suf); ok && exported[s] {
						base = s
					}
				}
				used[base] = true
				if !exported[base] {
					t.Errorf("panel %q uses %s, which no code under bridge/ or agent/ exports", p.Title, m)
				}
			}
		}
	}
	var unused []string
	for n := range exported {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	t.Logf("dashboard uses %d of %d exported metrics; not shown: %v", len(used), len(exported), unused)
}

// TestAlertRules: the shipped Prometheus rules are valid (promtool check
// rules), fire as their unit tests say (promtool test rules: each alert at
// its time, with its labels and annotations), and name only metrics the
// code exports.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: `make services` installs it (apt-get install prometheus)")
	}
	const dir = "../../etc/prometheus"
	for _, args := range [][]string{{"check", "rules", "vgpu-bridge.rules.yaml"}, {"test", "rules", "vgpu-bridge.rules.test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "vgpu-bridge.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	ref := regexp.MustCompile(`\b(?:vgpu_(?:bridge|agent)_|DCGM_FI_)[A-Za-z0-9_]+`)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		expr, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:")
		if !ok {
			continue
		}
		for _, m := range ref.FindAllString(expr, -1) {
			n++
			if !exported[m] {
				t.Errorf("rule expression %q uses %s, which no code under bridge/ or agent/ exports", strings.TrimSpace(expr), m)
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d metric references found in the rules: the scan is broken", n)
	}
}
