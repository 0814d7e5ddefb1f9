//go:build lab

package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestAgentUnitUnderSystemd: the packaged vgpu-agent.service (etc/systemd,
// its ExecStart pointed at the lab's binary and configuration, its
// watchdog shortened to 6 s) under the lab VM's own systemd. systemctl
// start returns only once the agent said READY=1 (Type=notify: connected
// and its first report confirmed), with the agent's status line; systemd
// hears the watchdog pings (WatchdogTimestamp moves); and each log line
// reaches the journal at its own priority: journalctl -p err shows the
// agent's error (a message on its command queue that is not a command)
// and none of its info lines, which -p info..info shows.
func TestAgentUnitUnderSystemd(t *testing.T) {
	needLab(t)
	share, vmShare := labEnv["LAB_SHARE_DIR"], labEnv["LAB_VM_SHARE_DIR"]
	host := testsvc.Name("lab") + ".lab.test"
	a := startLabAgentWith(t, agentOpts{host: host, statePath: vmShare + "/agents/" + host + "/state"})
	a.stop() // its configuration and keys stay; the packaged unit runs it now

	const unit = "vgpu-agent"
	dir := filepath.Join(share, "agents", host, "unit")
	testsvc.Must(t, os.MkdirAll(filepath.Join(dir, unit+".service.d"), 0o755), "mkdir")
	b, err := os.ReadFile(filepath.Join("..", "..", "etc", "systemd", unit+".service"))
	testsvc.Must(t, err, "read the packaged unit")
	testsvc.Must(t, os.WriteFile(filepath.Join(dir, unit+".service"), b, 0o644), "write the unit")
	cmd := strings.ReplaceAll(a.bin+" serve"+a.sets, "%", "%%") // systemd expands % specifiers
	dropIn := fmt.Sprintf("[Service]\nExecStart=\nExecStart=%s\nWatchdogSec=6s\n"+
		"# The journal and keys are on the lab's share.\nReadWritePaths=%s/agents\n", cmd, vmShare)
	testsvc.Must(t, os.WriteFile(filepath.Join(dir, unit+".service.d", "lab.conf"), []byte(dropIn), 0o644), "drop-in")
	vmDir := vmShare + "/agents/" + host + "/unit"
	t.Cleanup(func() {
		out, _ := vm(t, "journalctl -q -o cat -u "+unit+" | tail -n 200")
		if t.Failed() {
			t.Logf("%s.service in the lab:\n%s", unit, out)
		}
		vm(t, "systemctl stop "+unit+"; rm -rf /run/systemd/system/"+unit+".service*; systemctl daemon-reload; systemctl reset-failed; true")
	})

	started := time.Now()
	out, err := vm(t, fmt.Sprintf(`set -e
cp -r %[1]s/%[2]s.service %[1]s/%[2]s.service.d /run/systemd/system/
systemctl daemon-reload
timeout 280 systemctl start %[2]s`, vmDir, unit))
	if err != nil {
		t.Fatalf("systemctl start %s (returns at READY=1): %v\n%s", unit, err, out)
	}
	t.Logf("systemctl start returned after %s (READY=1)", time.Since(started).Round(100*time.Millisecond))
	props := unitProps(t, unit, "Type", "ActiveState", "SubState", "StatusText", "WatchdogUSec", "NotifyAccess", "MainPID")
	if props["Type"] != "notify" || props["ActiveState"] != "active" || props["SubState"] != "running" ||
		props["WatchdogUSec"] != "6s" || props["NotifyAccess"] != "main" || props["StatusText"] == "" {
		t.Errorf("%s after start: %v; want an active notify service with the agent's status line and a 6 s watchdog", unit, props)
	}
	t.Logf("status line: %q", props["StatusText"])

	// The watchdog: pinged every half WatchdogSec once the agent has
	// checked its RabbitMQ session.
	ping := func() uint64 {
		n, _ := strconv.ParseUint(unitProps(t, unit, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"], 10, 64)
		return n
	}
	first := ping()
	var last uint64
	poll(t, 30*time.Second, func() (bool, string) {
		last = ping()
		return first != 0 && last > first, fmt.Sprintf("WatchdogTimestampMonotonic %d then %d", first, last)
	})
	if p := unitProps(t, unit, "MainPID", "NRestarts"); p["MainPID"] != props["MainPID"] || p["NRestarts"] != "0" {
		t.Errorf("the agent was restarted meanwhile: %v (first main PID %s)", p, props["MainPID"])
	}

	// An error: a message on the agent's command queue that is not a command.
	testsvc.Must(t, a.ch.PublishWithContext(context.Background(), protocol.Exchange, protocol.CommandRoutingKey(host), false, false,
		amqp.Publishing{ContentType: "application/json", MessageId: "not-a-command", Body: []byte("this is not a command")}), "publish")
	var errs string
	poll(t, time.Minute, func() (bool, string) {
		errs, _ = vm(t, "journalctl -q -o cat -p err -u "+unit)
		return strings.Contains(errs, "not a command"), "journalctl -p err:\n" + errs
	})
	for _, line := range strings.Split(strings.TrimSpace(errs), "\n") {
		if !strings.Contains(line, "not a command") {
			t.Errorf("journalctl -p err shows a line that is not an error of this test: %q", line)
		}
	}
	out, _ = vm(t, "journalctl -q -o cat -p info..info -u "+unit)
	if !strings.Contains(out, "vgpu-agent started") || strings.Contains(out, "not a command") {
		t.Errorf("journalctl -p info..info shows:\n%s\nwant the agent's start and not its error", out)
	}
}
