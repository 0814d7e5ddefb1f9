// Command vgpu-agent runs on each compute host: it discovers GPUs and vGPU
// types and executes the bridge's commands against libvirt, sysfs and NVML.
package main

import (
	"context"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/daemon"
)

// The command-line set-up (flags, configuration, logger, signals, exit
// codes, version and genconfig) is package daemon's, shared with vgpu-bridge.
type (
	globals    = daemon.Globals
	usageError = daemon.UsageError
)

const exitUsage = daemon.ExitUsage

// spec describes vgpu-agent to package daemon.
var spec = daemon.Spec{
	Name:  "vgpu-agent",
	Short: "The vgpu-bridge agent of one compute host",
	Long: `vgpu-agent discovers the host's GPUs and vGPU types (NVML, sysfs mediated
devices, NVIDIA vendor VFIO), executes the bridge's commands (create and
attach vGPUs, tune GPUs, set VM limits) and reports the host's state.`,
	ConfigFile:     "/etc/vgpu-bridge/agent.conf",
	Sample:         "etc/vgpu-bridge/agent.conf.sample",
	Load:           agent.LoadConfig,
	Options:        agent.Options,
	SampleTitle:    agent.SampleTitle,
	ReferenceTitle: agent.ReferenceTitle,
	Debug:          agent.Debug,
	LogFormat:      agent.LogFormat,
	LogLevels:      agent.LogLevels,
	LogFile:        agent.LogFile,
	Probe:          func(v *conf.Values) daemon.Probe { return daemon.Probe{Listen: agent.Listen(v)} },
}

// subcommands are the commands of vgpu-agent, each built by a file of
// this package (version and genconfig are package daemon's).
var subcommands = []func(*globals) *cobra.Command{
	newInventoryCmd, newDiagnoseCmd, newLayoutCmd, newRestoreCmd, newServeCmd,
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	return daemon.Main(spec, args, stdout, stderr, subcommands...)
}

func newServeCmd(g *globals) *cobra.Command {
	var o agent.RunOptions
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the agent until SIGINT or SIGTERM (SIGHUP reloads keys, SIGUSR2 writes a report)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			if errs := agent.CheckSigning(v); len(errs) > 0 {
				return errs // exit 2, as a bad configuration
			}
			o.LoadConfig = g.Load // SIGHUP: new key paths and key_id apply
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
			o.Report = svc.Report
			// Connected and reported: READY=1, then WATCHDOG=1 after
			// each check of the RabbitMQ session.
			o.Ready = func(status string, healthy func(context.Context) error) {
				svc.Ready(status)
				go svc.Watchdog(ctx, healthy)
			}
			return agent.RunWith(ctx, v, log, o)
		},
	}
	c.Flags().StringVar(&o.FakeHostDir, "fake-host", "",
		"run on a simulated host under DIR (fake sysfs, libvirt test driver, NVML mock; built there when missing); "+
			"the journal goes to DIR/state unless [DEFAULT] state_path is set")
	return c
}
