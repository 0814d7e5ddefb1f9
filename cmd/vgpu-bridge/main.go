// Command vgpu-bridge is the central daemon of vgpu-bridge: it consumes
// Nova's notifications and webhooks, decides and acts on vGPUs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/manpage"
	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// Exit codes scripts can rely on.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2 // bad flags or bad configuration
)

// globals are the flags every subcommand shares.
type globals struct {
	configFile string
	overrides  []string
	debug      bool
	stdout     io.Writer
	stderr     io.Writer
}

// exitCode ends a command with that exit status and nothing more said
// (the command has printed what it had to).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// usageError marks errors that exit with exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// subcommands are the commands of vgpu-bridge, each built by a file of
// this package.
var subcommands = []func(*globals) *cobra.Command{
	newKeysCmd, newKeystoneCmd, newServeCmd, newVersionCmd, newGenconfigCmd, newMigrateCmd,
	newPolicyCmd, newPurgeCmd, newSyncCmd, newUpgradeCmd,
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g := &globals{stdout: stdout, stderr: stderr}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetVersionTemplate(version.String("vgpu-bridge") + "\n")
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	if es, ok := conf.AsErrors(err); ok {
		fmt.Fprintln(stderr, "vgpu-bridge: bad configuration:")
		for _, e := range es {
			fmt.Fprintln(stderr, "  "+e.Error())
		}
		return exitUsage
	}
	fmt.Fprintln(stderr, "vgpu-bridge:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFailure
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:     "vgpu-bridge",
		Version: version.Version(),
		Short:   "Elastic, policy-driven NVIDIA vGPU for OpenStack",
		Long: `vgpu-bridge consumes Nova's versioned notifications and signed webhooks,
turns them into vGPU intents with its policy engine, places them against
Placement's VGPU inventories and acts through Nova or the vgpu-agents.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.configFile, "config", defaultConfigFile(),
		"INI configuration file (see etc/vgpu-bridge/bridge.conf.sample); empty reads none")
	pf.StringArrayVar(&g.overrides, "set", nil,
		"override one option, SECTION.OPTION=VALUE (repeatable; wins over file and environment)")
	pf.BoolVar(&g.debug, "debug", false, "log at debug level (same as --set DEFAULT.debug=true)")
	for _, sc := range subcommands {
		root.AddCommand(sc(g))
	}
	root.AddCommand(manpage.Command("8"))
	return root
}

func defaultConfigFile() string {
	const p = "/etc/vgpu-bridge/bridge.conf"
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

// load reads the configuration with the flags' overrides.
func (g *globals) load() (*conf.Values, error) {
	ov := g.overrides
	if g.debug {
		ov = append(ov, "DEFAULT.debug=true")
	}
	return bridge.LoadConfig(conf.Source{File: g.configFile, Environ: os.Environ(), Overrides: ov})
}

// logger builds the process logger from [DEFAULT] debug and log_format.
func (g *globals) logger(v *conf.Values) *slog.Logger {
	level := slog.LevelInfo
	if bridge.Debug(v) {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if bridge.LogFormat(v) == "text" {
		return slog.New(slog.NewTextHandler(g.stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(g.stderr, opts))
}

func newServeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the bridge daemon until SIGINT or SIGTERM (SIGHUP reloads secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.load()
			if err != nil {
				return err
			}
			if errs := bridge.CheckSigning(v); len(errs) > 0 {
				return errs // exit 2, as a bad configuration
			}
			ctx := cmd.Context()
			// SIGHUP reads the configuration again and swaps the secrets
			// it names (bridge/reload.go); the listeners stay up.
			return bridge.Run(ctx, v, g.logger(v), func(d *bridge.Daemon) { go d.ReloadOnSignal(ctx, g.load) })
		},
	}
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(g.stdout, version.String("vgpu-bridge"))
			return nil
		},
	}
}

func newGenconfigCmd(g *globals) *cobra.Command {
	var out, format string
	c := &cobra.Command{
		Use:   "genconfig",
		Short: "Write the commented sample configuration generated from the option definitions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := g.stdout
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if format == "rst" {
				return bridge.Options().WriteReference(w, bridge.ReferenceTitle)
			}
			return bridge.Options().WriteSample(w, bridge.SampleTitle)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write (default: standard output)")
	c.Flags().StringVar(&format, "format", "ini", "ini (the sample file) or rst (the documentation's reference)")
	return c
}
