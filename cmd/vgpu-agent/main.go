// Command vgpu-agent runs on each compute host: it discovers GPUs and vGPU
// types and executes the bridge's commands against libvirt, sysfs and NVML.
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

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/manpage"
	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// globals are the flags every subcommand shares.
type globals struct {
	configFile string
	overrides  []string
	debug      bool
	stdout     io.Writer
	stderr     io.Writer
}

type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// subcommands are the commands of vgpu-agent, each built by a file of
// this package.
var subcommands = []func(*globals) *cobra.Command{
	newInventoryCmd, newDiagnoseCmd, newServeCmd, newVersionCmd, newGenconfigCmd,
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:     "vgpu-agent",
		Version: version.Version(),
		Short:   "The vgpu-bridge agent of one compute host",
		Long: `vgpu-agent discovers the host's GPUs and vGPU types (NVML, sysfs mediated
devices, NVIDIA vendor VFIO), executes the bridge's commands (create and
attach vGPUs, tune GPUs, set VM limits) and reports the host's state.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.configFile, "config", defaultConfigFile(),
		"INI configuration file (see etc/vgpu-bridge/agent.conf.sample); empty reads none")
	pf.StringArrayVar(&g.overrides, "set", nil,
		"override one option, SECTION.OPTION=VALUE (repeatable; wins over file and environment)")
	pf.BoolVar(&g.debug, "debug", false, "log at debug level (same as --set DEFAULT.debug=true)")
	for _, sc := range subcommands {
		root.AddCommand(sc(g))
	}
	root.AddCommand(manpage.Command("8"))
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetVersionTemplate(version.String("vgpu-agent") + "\n")
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if es, ok := conf.AsErrors(err); ok {
		fmt.Fprintln(stderr, "vgpu-agent: bad configuration:")
		for _, e := range es {
			fmt.Fprintln(stderr, "  "+e.Error())
		}
		return exitUsage
	}
	fmt.Fprintln(stderr, "vgpu-agent:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFailure
}

func defaultConfigFile() string {
	const p = "/etc/vgpu-bridge/agent.conf"
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

func (g *globals) load() (*conf.Values, error) {
	ov := g.overrides
	if g.debug {
		ov = append(ov, "DEFAULT.debug=true")
	}
	return agent.LoadConfig(conf.Source{File: g.configFile, Environ: os.Environ(), Overrides: ov})
}

func (g *globals) logger(v *conf.Values) *slog.Logger {
	level := slog.LevelInfo
	if agent.Debug(v) {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if agent.LogFormat(v) == "text" {
		return slog.New(slog.NewTextHandler(g.stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(g.stderr, opts))
}

func newServeCmd(g *globals) *cobra.Command {
	var o agent.RunOptions
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the agent until SIGINT or SIGTERM (SIGHUP reloads keys)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.load()
			if err != nil {
				return err
			}
			if errs := agent.CheckSigning(v); len(errs) > 0 {
				return errs // exit 2, as a bad configuration
			}
			o.LoadConfig = g.load // SIGHUP: new key paths and key_id apply
			return agent.RunWith(cmd.Context(), v, g.logger(v), o)
		},
	}
	c.Flags().StringVar(&o.FakeHostDir, "fake-host", "",
		"run on a simulated host under DIR (fake sysfs, libvirt test driver, NVML mock; built there when missing); "+
			"the journal goes to DIR/state unless [DEFAULT] state_path is set")
	return c
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(g.stdout, version.String("vgpu-agent"))
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
		RunE: func(*cobra.Command, []string) error {
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
				return agent.Options().WriteReference(w, agent.ReferenceTitle)
			}
			return agent.Options().WriteSample(w, agent.SampleTitle)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write (default: standard output)")
	c.Flags().StringVar(&format, "format", "ini", "ini (the sample file) or rst (the documentation's reference)")
	return c
}
