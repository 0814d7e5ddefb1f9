package agent

import (
	"path/filepath"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// commandsOptions are the options declared in this file; Options
// assembles them into the daemon's set.
var commandsOptions = conf.NewGroup()

// [DEFAULT] options of the agent's local state (those of the command loop,
// the journal and the reports are packages transport's, executor's and
// journal's).
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
)

// JournalPath is state_path/journal.
func JournalPath(v *conf.Values) string { return filepath.Join(optStatePath.Get(v), "journal") }
