//go:build lab

package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestAnsiblePlaybook: deploy/ansible/site.yml, run from this machine over
// SSH against the lab VM (systemd as init) as the bridge host and as a
// compute host at once, with the packages make deb builds here. It
// installs both daemons, writes their configuration, makes the bridge's
// key, enrols the agent's, starts the units and ends with the bridge
// answering /v1/ and the agent reporting to it (GET /v1/status lists its report).
// The bridge in the VM reaches this machine's Postgres, RabbitMQ and
// Placement through QEMU's user networking (10.0.2.2). A second run
// changes nothing.
func TestAnsiblePlaybook(t *testing.T) {
	needLab(t)
	playbook, err := exec.LookPath("ansible-playbook")
	if err != nil {
		t.Fatal("ansible-playbook is not installed (make services installs ansible-core)")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	testsvc.Must(t, err, "repository root")
	debs := t.TempDir()
	build := exec.Command("make", "--no-print-directory", "deb", "DEB_DIR="+debs)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}

	inVM := strings.NewReplacer("@127.0.0.1:", "@10.0.2.2:", "@localhost:", "@10.0.2.2:", "//127.0.0.1:", "//10.0.2.2:")
	db := inVM.Replace(testsvc.Postgres(t))
	placement := inVM.Replace(testsvc.PlacementURL(t))
	// A virtual host of its own: the bridge in the VM must not take the
	// reports and results of the tests' bridges on the shared broker.
	transport := inVM.Replace(testsvc.PrivateVHost(t))
	host := testsvc.Name("lab") + ".lab.test"
	token := "ansible-" + testsvc.Name("tok") + "-0123456789"
	queue := testsvc.Name("vgpu-lab-notifications")

	dir := t.TempDir()
	inventory := filepath.Join(dir, "inventory.ini")
	vars := fmt.Sprintf(`[vgpu_bridge]
%[1]s
[vgpu_agents]
%[1]s
[all:vars]
ansible_host=127.0.0.1
ansible_port=%[2]s
ansible_user=root
ansible_ssh_private_key_file=%[3]s
ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o GSSAPIAuthentication=no'
ansible_python_interpreter=/usr/bin/python3
vgpu_deb_dir=%[4]s
vgpu_transport_url=%[5]s
`, host, labEnv["LAB_SSH_PORT"], labEnv["LAB_SSH_KEY"], debs, transport)
	testsvc.Must(t, os.WriteFile(inventory, []byte(vars), 0o600), "inventory")
	extra := filepath.Join(dir, "vars.yml")
	testsvc.Must(t, os.WriteFile(extra, []byte(fmt.Sprintf(`vgpu_bridge_database_connection: %q
vgpu_bridge_api_listen: "127.0.0.1:9797"
vgpu_bridge_auth_strategy: token
vgpu_bridge_api_tokens: ["%[2]s admin ops"]
vgpu_bridge_secret_files: {"/etc/vgpu-bridge/placement-token": "admin\n"}
vgpu_bridge_config:
  placement: {endpoint_override: %[3]q, token_file: /etc/vgpu-bridge/placement-token}
  notifications: {queue: %[4]q}
vgpu_agent_enabled_types: mtty_pci-1
vgpu_agent_config:
  nvml: {backend: none}
vgpu_agent_check_token: %[2]q
`, db, token, placement, queue)), 0o600), "vars")

	t.Cleanup(func() {
		out, _ := vm(t, `journalctl -q -o cat -u vgpu-bridge -u vgpu-bridge-migrate -u vgpu-agent | tail -n 100
systemctl stop vgpu-agent vgpu-bridge vgpu-agent-restore 2>/dev/null
dpkg --purge vgpu-agent vgpu-bridge vgpuctl >/dev/null 2>&1
rm -rf /etc/vgpu-bridge /var/lib/vgpu-bridge /var/cache/vgpu-bridge-deploy /etc/systemd/system/vgpu-bridge.service.d
systemctl daemon-reload; systemctl reset-failed; true`)
		if t.Failed() {
			t.Logf("the daemons in the lab:\n%s", out)
		}
	})
	run := func(what string) string {
		t.Helper()
		start := time.Now()
		cmd := exec.Command(playbook, "-i", inventory, "-e", "@"+extra, filepath.Join(root, "deploy", "ansible", "site.yml"))
		cmd.Env = append(os.Environ(), "ANSIBLE_CONFIG="+filepath.Join(root, "deploy", "ansible", "ansible.cfg"),
			"ANSIBLE_NOCOLOR=1", "ANSIBLE_HOST_KEY_CHECKING=False")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("ansible-playbook (%s): %v\n%s", what, err, testsvc.LastLines(string(out), 80))
		}
		t.Logf("ansible-playbook (%s) in %s", what, time.Since(start).Round(time.Second))
		return string(out)
	}
	first := run("first run")
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(host) + ` +: ok=\d+ +changed=[1-9]\d* +unreachable=0 +failed=0`).MatchString(first) {
		t.Errorf("the first run's recap does not show changes and no failure:\n%s", testsvc.LastLines(first, 10))
	}

	// What the playbook left: the bridge answers /v1/, the agent reports
	// to it, both units are enabled and active.
	out, err := vm(t, `curl -sf http://127.0.0.1:9797/v1/`)
	if err != nil || !strings.Contains(out, `"id":"v1"`) {
		t.Errorf("GET /v1/ after the playbook: %v\n%s", err, out)
	}
	out, err = vm(t, `curl -sf -H 'X-Auth-Token: `+token+`' http://127.0.0.1:9797/v1/status`)
	if err != nil || !strings.Contains(out, `"name":"`+host+`"`) {
		t.Errorf("GET /v1/status after the playbook does not list %s: %v\n%s", host, err, out)
	}
	out, err = vm(t, `systemctl is-enabled vgpu-bridge vgpu-agent vgpu-agent-restore; systemctl is-active vgpu-bridge vgpu-agent`)
	if got := strings.Fields(out); err != nil || strings.Join(got, " ") != "enabled enabled enabled active active" {
		t.Errorf("the units after the playbook (enabled ×3, active ×2): %v %q", err, got)
	}

	second := run("second run")
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(host) + ` +: ok=\d+ +changed=0 +unreachable=0 +failed=0`).MatchString(second) {
		t.Errorf("a second run changed something:\n%s", testsvc.LastLines(second, 60))
	}
}
