// Package daemon is the command-line set-up vgpu-bridge and vgpu-agent
// share: the root command and its flags (--config, --set, --debug),
// loading the configuration with them, the process logger, SIGINT and
// SIGTERM ending the context, the exit codes, and the version and
// genconfig subcommands. Each daemon describes itself in a Spec.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/manpage"
	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// Exit codes scripts can rely on.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2 // bad flags or bad configuration
)

// ExitCode ends a command with that exit status and nothing more said
// (the command has printed what it had to).
type ExitCode int

func (e ExitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// UsageError marks errors that exit with ExitUsage.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Spec is what differs between the daemons.
type Spec struct {
	Name        string // "vgpu-bridge"
	Short, Long string // the root command's help
	// ConfigFile is the configuration read when it exists and --config
	// is not given; Sample names its sample in the flag's help.
	ConfigFile, Sample string
	// Load reads and checks the configuration.
	Load func(conf.Source) (*conf.Values, error)
	// Options is the daemon's option set (genconfig), with the titles of
	// its sample and of its reference.
	Options                     func() *conf.Set
	SampleTitle, ReferenceTitle string
	// Debug and LogFormat read [DEFAULT] debug and log_format;
	// LogLevels reads [DEFAULT] default_log_levels (nil: none).
	Debug     func(*conf.Values) bool
	LogFormat func(*conf.Values) string
	LogLevels func(*conf.Values) []string
	// LogFile is where serve logs ([DEFAULT] log_file and log_dir); ""
	// or nil: standard error.
	LogFile func(*conf.Values) string
	// Probe is where the running daemon answers /healthz and /readyz
	// (the healthcheck command); nil: it has none.
	Probe func(*conf.Values) Probe
}

// Globals are the flags every subcommand shares, and where it writes.
type Globals struct {
	Spec       Spec
	ConfigFile string
	ConfigDir  string
	Overrides  []string
	Debug      bool
	Stdout     io.Writer
	Stderr     io.Writer
}

// Load reads the configuration with the flags' overrides.
func (g *Globals) Load() (*conf.Values, error) {
	ov := g.Overrides
	if g.Debug {
		ov = append(ov, "DEFAULT.debug=true")
	}
	v, err := g.Spec.Load(conf.Source{File: g.ConfigFile, Dir: g.ConfigDir, Environ: os.Environ(), Overrides: ov})
	if err != nil {
		return v, err
	}
	if _, err := g.logLevels(v); err != nil {
		return nil, conf.Errors{{Section: conf.DefaultSection, Option: "default_log_levels",
			Value: strings.Join(g.Spec.LogLevels(v), ","), Problem: err.Error()}}
	}
	return v, nil
}

func (g *Globals) logLevels(v *conf.Values) (map[string]slog.Level, error) {
	if g.Spec.LogLevels == nil {
		return nil, nil
	}
	return ParseLogLevels(g.Spec.Name, g.Spec.LogLevels(v))
}

// Logger builds the process logger from [DEFAULT] debug, log_format and
// default_log_levels: JSON (slog's), text, or oslo_json (oslo.log's
// JSONFormatter's records, for the log pipelines of OpenStack clouds).
// Under systemd, where standard error is journald's stream, each line
// carries its syslog priority (errors at err, warnings at warning).
func (g *Globals) Logger(v *conf.Values) *slog.Logger { return g.loggerTo(g.Stderr, v) }

// DaemonLogger is the logger of the daemon itself (serve): Logger's,
// writing to [DEFAULT] log_file when that is set (reopened when logrotate
// moves it). close closes the file.
func (g *Globals) DaemonLogger(v *conf.Values) (log *slog.Logger, close func() error, err error) {
	path := ""
	if g.Spec.LogFile != nil {
		path = g.Spec.LogFile(v)
	}
	if path == "" {
		return g.Logger(v), func() error { return nil }, nil
	}
	f, err := openWatched(path)
	if err != nil {
		return nil, nil, err
	}
	return g.loggerTo(f, v), f.Close, nil
}

func (g *Globals) loggerTo(w io.Writer, v *conf.Values) *slog.Logger {
	level := slog.LevelInfo
	if g.Spec.Debug(v) {
		level = slog.LevelDebug
	}
	levels, _ := g.logLevels(v) // Load refused bad ones
	opts := &slog.HandlerOptions{Level: lowestLevel(level, levels)}
	build := func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, opts) }
	switch g.Spec.LogFormat(v) {
	case "text":
		build = func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, opts) }
	case "oslo_json":
		build = func(w io.Writer) slog.Handler { return newOsloJSONHandler(w, g.Spec.Name, opts.Level) }
	}
	var h slog.Handler
	if onJournal(w) {
		h = newPriorityHandler(w, build)
	} else {
		h = build(w)
	}
	return slog.New(withLogLevels(h, level, levels))
}

// Main runs the daemon's command line with args (the program name left
// out) until it ends or SIGINT or SIGTERM ends its context, and returns
// the exit status. Besides subcommands it has version, genconfig, config
// check and the manual page's command.
func Main(spec Spec, args []string, stdout, stderr io.Writer, subcommands ...func(*Globals) *cobra.Command) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g := &Globals{Spec: spec, Stdout: stdout, Stderr: stderr}
	root := &cobra.Command{
		Use:           spec.Name,
		Version:       version.Version(),
		Short:         spec.Short,
		Long:          spec.Long,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return UsageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.ConfigFile, "config", existing(spec.ConfigFile),
		"INI configuration file (see "+spec.Sample+"); empty reads none")
	pf.StringVar(&g.ConfigDir, "config-dir", "",
		"directory of drop-in files, as oslo.config's: every *.conf in it, in name order, after --config; a later file's value wins")
	pf.StringArrayVar(&g.Overrides, "set", nil,
		"override one option, SECTION.OPTION=VALUE (repeatable; wins over file and environment)")
	pf.BoolVar(&g.Debug, "debug", false, "log at debug level (same as --set DEFAULT.debug=true)")
	for _, sc := range append(subcommands, versionCmd, genconfigCmd, configCmd, healthcheckCmd) {
		root.AddCommand(sc(g))
	}
	root.AddCommand(manpage.Command("8"))
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetVersionTemplate(version.String(spec.Name) + "\n")
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ec ExitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	if es, ok := conf.AsErrors(err); ok {
		fmt.Fprintln(stderr, spec.Name+": bad configuration:")
		for _, e := range es {
			fmt.Fprintln(stderr, "  "+e.Error())
		}
		return ExitUsage
	}
	fmt.Fprintln(stderr, spec.Name+":", err)
	var ue UsageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	return ExitFailure
}

// existing is p when it exists, else "" (no file).
func existing(p string) string {
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

func versionCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(g.Stdout, version.String(g.Spec.Name))
			return nil
		},
	}
}

func genconfigCmd(g *Globals) *cobra.Command {
	var out, format string
	c := &cobra.Command{
		Use:   "genconfig",
		Short: "Write the commented sample configuration generated from the option definitions",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			w := g.Stdout
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if format == "rst" {
				return g.Spec.Options().WriteReference(w, g.Spec.ReferenceTitle)
			}
			return g.Spec.Options().WriteSample(w, g.Spec.SampleTitle)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write (default: standard output)")
	c.Flags().StringVar(&format, "format", "ini", "ini (the sample file) or rst (the documentation's reference)")
	return c
}

func configCmd(g *Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "config",
		Short: "Work with the configuration files",
	}
	c.AddCommand(&cobra.Command{
		Use:   "check",
		Short: "Check the configuration (--config, --set, environment) without starting anything",
		Long: "check reads the configuration as the daemon would and lists every problem: an unknown section or " +
			"option (a typo), a value out of range, options that contradict each other. It exits 0 when there is " +
			"none (after the warnings the daemon would log at start: deprecated names, oslo options it ignores), " +
			"2 with the list on standard error. It opens no connection and reads no key or secret file " +
			"beyond the configuration itself.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			// What the daemon would log at start as configuration
			// warnings: deprecated names, oslo options it ignores.
			for _, w := range v.Warnings {
				fmt.Fprintf(g.Stdout, "%s: warning: %s\n", g.Spec.Name, w)
			}
			what := strings.TrimSpace(g.ConfigFile + " " + g.ConfigDir)
			if what == "" {
				what = "(no file: defaults, environment and --set)"
			}
			fmt.Fprintf(g.Stdout, "%s: configuration OK: %s\n", g.Spec.Name, what)
			return nil
		},
	})
	return c
}
