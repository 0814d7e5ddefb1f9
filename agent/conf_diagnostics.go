// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"cmp"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/diagbundle"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// [diagnostics] options of the collect_diagnostics bundle.
var (
	optDiagMaxBundleBytes = diagnosticsOptions.Int("diagnostics", "max_bundle_bytes", diagbundle.DefaultMaxBytes, 64<<10, 64<<20,
		"Upper bound on a diagnostics bundle (the tar.gz `vgpuctl diagnose` fetches through the bridge). When the parts "+
			"are larger, the largest are truncated first (logs keep their newest lines) and MANIFEST.json says so. "+
			"Example: 8388608")
	optDiagBugReportTool = diagnosticsOptions.String("diagnostics", "bug_report_tool", "nvidia-bug-report.sh",
		"NVIDIA's bug report script, by name (looked up on PATH) or path; run with --output-file into a temporary "+
			"directory. When it is not found the bundle says so and goes on. Example: /usr/bin/nvidia-bug-report.sh")
	optDiagBugReportTimeout = diagnosticsOptions.Duration("diagnostics", "bug_report_timeout", 5*time.Minute, time.Second, time.Hour,
		"How long nvidia-bug-report.sh may run before it is killed and its part skipped. Example: 2m")
	optDiagKernelLog = diagnosticsOptions.String("diagnostics", "kernel_log_file", "",
		"A file holding the kernel log whose NVRM lines the bundle keeps; empty runs dmesg. Example: /var/log/kern.log")
	optDiagLogFile = diagnosticsOptions.String("diagnostics", "log_file", "",
		"The agent's own log file (when its standard error goes to a file), whose tail the bundle keeps; URL "+
			"passwords in it are masked. Empty: [DEFAULT] log_file (with log_dir) when set, else the part is left out "+
			"(read journald instead). "+
			"Example: /var/log/vgpu-bridge/agent.log")
)

// diagnosticsOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var diagnosticsOptions = conf.NewGroup().
	SectionHelp("diagnostics", "What the collect_diagnostics bundle gathers (vgpuctl diagnose HOST): "+
		"diagnose checks, nvidia-bug-report.sh, domain XML, NVRM kernel lines, mdev and VF sysfs state, the agent's "+
		"log tail, journal, version and configuration (secrets masked; *_file options show the path, never the content).")

// diagnosticsSettings are the [diagnostics] options.
type diagnosticsSettings struct {
	MaxBytes      int
	Tool          string
	ToolTimeout   time.Duration
	KernelLogFile string
	LogFile       string
}

func diagnosticsFrom(v *conf.Values) diagnosticsSettings {
	return diagnosticsSettings{MaxBytes: optDiagMaxBundleBytes.Get(v), Tool: optDiagBugReportTool.Get(v),
		ToolTimeout: optDiagBugReportTimeout.Get(v), KernelLogFile: optDiagKernelLog.Get(v), LogFile: cmp.Or(optDiagLogFile.Get(v), LogFile(v))}
}
