// Command vgpu-bridge is the central daemon of vgpu-bridge: it consumes
// Nova's notifications and webhooks, decides and acts on vGPUs.
package main

import (
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/daemon"
)

// The command-line set-up (flags, configuration, logger, signals, exit
// codes, version and genconfig) is package daemon's, shared with vgpu-agent.
type (
	globals    = daemon.Globals
	usageError = daemon.UsageError
	exitCode   = daemon.ExitCode
)

const exitUsage = daemon.ExitUsage

// spec describes vgpu-bridge to package daemon.
var spec = daemon.Spec{
	Name:  "vgpu-bridge",
	Short: "Elastic, policy-driven NVIDIA vGPU for OpenStack",
	Long: `vgpu-bridge consumes Nova's versioned notifications and signed webhooks,
turns them into vGPU intents with its policy engine, places them against
Placement's VGPU inventories and acts through Nova or the vgpu-agents.`,
	ConfigFile:     "/etc/vgpu-bridge/bridge.conf",
	Sample:         "etc/vgpu-bridge/bridge.conf.sample",
	Load:           bridge.LoadConfig,
	Options:        bridge.Options,
	SampleTitle:    bridge.SampleTitle,
	ReferenceTitle: bridge.ReferenceTitle,
	Debug:          bridge.Debug,
	LogFormat:      bridge.LogFormat,
	LogLevels:      bridge.LogLevels,
	LogFile:        bridge.LogFile,
	Probe: func(v *conf.Values) daemon.Probe {
		listen, cert := bridge.APIListener(v)
		return daemon.Probe{Listen: listen, CertFile: cert}
	},
}

// subcommands are the commands of vgpu-bridge, each built by a file of
// this package (version and genconfig are package daemon's).
var subcommands = []func(*globals) *cobra.Command{
	newGenpolicyCmd, newKeysCmd, newKeystoneCmd, newServeCmd, newMigrateCmd,
	newPolicyCmd, newPurgeCmd, newSyncCmd, newUpgradeCmd,
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	return daemon.Main(spec, args, stdout, stderr, subcommands...)
}

func newServeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the bridge daemon until SIGINT or SIGTERM (SIGHUP reloads secrets, SIGUSR2 writes a report)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			if errs := bridge.CheckSigning(v); len(errs) > 0 {
				return errs // exit 2, as a bad configuration
			}
			ctx := cmd.Context()
			log, closeLog, err := g.DaemonLogger(v)
			if err != nil {
				return err
			}
			defer closeLog()
			// SIGUSR2 writes the Guru Meditation Report; systemd hears
			// STOPPING=1 when ctx ends (internal/daemon).
			svc := g.Serve(ctx, v, log)
			defer svc.Stopping()
			return bridge.Run(ctx, v, log, func(d *bridge.Daemon) {
				// SIGHUP reads the configuration again and swaps the
				// secrets it names (bridge/reload.go); the listeners stay up.
				go d.ReloadOnSignal(ctx, g.Load)
				svc.Report.Add(d.ReportSections()...)
				// The API listens and the schema is current: READY=1,
				// then WATCHDOG=1 after each check of the database.
				svc.Ready("serving the API on " + d.API.Addr())
				go svc.Watchdog(ctx, d.Healthy)
			})
		},
	}
}
