package agent

import (
	"path/filepath"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// commandsOptions are the options declared in this file; Options
// assembles them into the daemon's set.
var commandsOptions = conf.NewGroup()

// [DEFAULT] options of the command loop, the journal and the reports.
var (
	optStatePath = commandsOptions.String(conf.DefaultSection, "state_path", "/var/lib/vgpu-bridge/agent",
		"Directory of the agent's local state: the journal of commands and of the mdevs and VF types the agent "+
			"created (state_path/journal). Keep it on a local, persistent file system: after a reboot the agent "+
			"recreates what the journal lists. One agent per directory: a second one started on it stops at once "+
			"(state_path/journal.lock). Example: /var/lib/vgpu-bridge/agent")
	optNode = commandsOptions.String(conf.DefaultSection, "node", "",
		"The hypervisor node name reported to the bridge: what Placement names this host's root resource provider "+
			"(nova-compute's hypervisor_hostname, often the FQDN). Empty means the machine's host name. "+
			"Example: compute-0012.example.org")
	optReportInterval = commandsOptions.Duration(conf.DefaultSection, "report_interval", time.Minute, 5*time.Second, time.Hour,
		"Period of the full reports sent to the bridge on report.<host>; a report is also sent at start and when "+
			"the host changes. Keep it well under the bridge's maximum report age. Example: 30s")
	optReportCheckInterval = commandsOptions.Duration(conf.DefaultSection, "report_check_interval", 10*time.Second, time.Second, time.Hour,
		"How often the agent looks at the host for a change (a new mdev, a VM started) that is reported before "+
			"report_interval ends. Example: 5s")
	optColdShutdownTimeout = commandsOptions.Duration(conf.DefaultSection, "cold_shutdown_timeout", 2*time.Minute, time.Second, time.Hour,
		"Default bound on the graceful guest shutdown of a cold attach or detach (mode=cold) when the command "+
			"gives none. When it passes the command fails with code timeout; the VM is never destroyed. Example: 5m")
	optCommandTimeout = commandsOptions.Duration(conf.DefaultSection, "command_timeout", 10*time.Minute, 10*time.Second, 2*time.Hour,
		"Upper bound on the execution of one command. Example: 15m")
	optClockSkew = commandsOptions.Duration(conf.DefaultSection, "command_clock_skew", 5*time.Second, 0, 10*time.Minute,
		"How far past its expires_at a command is still accepted, for clocks of bridge and agent that disagree. "+
			"Later commands are refused with code expired and never executed. Example: 2s")
	optJournalRetention = commandsOptions.Duration(conf.DefaultSection, "journal_retention", 24*time.Hour, time.Hour, 30*24*time.Hour,
		"How long the result of a finished command is kept in the journal (past its expiry too) to answer a "+
			"duplicate delivery with the recorded result instead of executing it again. Example: 72h")
	optPrefetch = commandsOptions.Int(conf.DefaultSection, "command_prefetch", 1, 1, 64,
		"Commands RabbitMQ may deliver before the agent acknowledges them. Commands run one at a time; more only "+
			"hides the network round trip. Example: 4")
	optReconnectMax = commandsOptions.Duration(conf.DefaultSection, "reconnect_max_backoff", 30*time.Second, time.Second, 10*time.Minute,
		"Longest wait between attempts to reconnect to RabbitMQ (the wait doubles from 0.5s up to this, with "+
			"jitter). Example: 1m")
)

// JournalPath is state_path/journal.
func JournalPath(v *conf.Values) string { return filepath.Join(optStatePath.Get(v), "journal") }
