package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/internal/manpage"
	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
	buildversion "github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// version is the build's (package internal/version).
var version = buildversion.Version()

// Exit codes scripts can rely on (contract: documented in --help and README).
const (
	exitOK       = 0
	exitFailure  = 1 // the API answered with an error, or the command failed
	exitUsage    = 2 // bad flags or arguments
	exitNotReady = 3 // health: the bridge answered but is not ready
	exitNoAPI    = 4 // the API could not be reached
	exitRequest  = 5 // a watched request ended failed or rejected
	exitGaveUp   = 6 // --wait-timeout passed before the request was final
)

const exitCodesHelp = `Exit codes:
  0  success (a watched request ended succeeded)
  1  the API answered with an error (printed as "title: detail" and each invalid field), or the command failed
  2  usage: unknown command, bad flag or argument
  3  health: the bridge answered but is not ready
  4  the API could not be reached
  5  a watched request ended failed or rejected (requests show --watch, webhook send --watch)
  6  --wait-timeout passed before the watched request reached a final state`

const rootLong = `vgpuctl operates vgpu-bridge through its operator API (GET /v1/openapi.json).

Output, as the openstack client's: -f table (the default), -f json or -f yaml
(the API's answer as sent), -f value (cells separated by spaces, no header),
-f csv; -c COLUMN (repeatable) keeps those columns of a list, or those fields
of a show, in every format (json and yaml then key them by column name in
lower case, spaces as underscores). -o is the same as -f.

Credentials, first match wins:
  --token / VGPUCTL_TOKEN        a static token of [api] token_file, sent as X-Auth-Token
  --os-cloud / OS_CLOUD          log in to Keystone with that cloud of clouds.yaml
                                 ($OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/,
                                 /etc/openstack/) and send the Keystone token
  OS_AUTH_URL and the other      log in to Keystone with the variables of an openrc file:
  OS_* variables                 OS_USERNAME/OS_USER_ID and OS_PASSWORD, OS_PROJECT_NAME/_ID,
                                 OS_USER_DOMAIN_NAME/_ID, OS_PROJECT_DOMAIN_NAME/_ID;
                                 OS_AUTH_TYPE=token with OS_TOKEN; OS_AUTH_TYPE=
                                 v3applicationcredential with OS_APPLICATION_CREDENTIAL_ID
                                 and _SECRET
--os-region-name / OS_REGION_NAME and --os-interface / OS_INTERFACE choose the
catalog's endpoint (the flags win over the variables and clouds.yaml).
The bridge is found at --url / VGPUCTL_URL; without either, a Keystone login
finds it in the catalog (service type vgpu, the region and interface), and
otherwise it is http://127.0.0.1:9797.
--os-cacert / OS_CACERT names a CA bundle that verifies both Keystone and the
bridge (besides clouds.yaml's cacert for Keystone).

` + exitCodesHelp

type globals struct {
	url, token, cloud, output string
	cacert, region, iface     string
	// columns are -c's: the table columns (or show fields) to print.
	columns        []string
	timeout        time.Duration
	stdout, stderr io.Writer
	// tty reports whether stderr is a terminal (spinners); nil means no.
	tty    func() bool
	client *apiclient.Client
}

// exitError carries the exit code of a failure.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

func usageErr(err error) error { return exitError{exitUsage, err} }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr, tty: func() bool { return isTerminal(stderr) }}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetVersionTemplate(buildversion.String("vgpuctl") + "\n")
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	printError(stderr, err)
	if code == exitUsage {
		fmt.Fprintln(stderr, "Run 'vgpuctl --help' for usage.")
	}
	return code
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "vgpuctl",
		Version:       buildversion.Version(),
		Short:         "Operate vgpu-bridge through its API",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Own completion command: bash, zsh and fish only.
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return checkOutput(g.output)
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&g.url, "url", os.Getenv("VGPUCTL_URL"), "base URL of the bridge API (env VGPUCTL_URL; default: the catalog's "+
		"vgpu endpoint with --os-cloud, else "+defaultURL+")")
	pf.StringVar(&g.cacert, "os-cacert", os.Getenv("OS_CACERT"), "CA bundle verifying Keystone and the bridge (env OS_CACERT)")
	pf.StringVar(&g.token, "token", "", "API token (env VGPUCTL_TOKEN; prefer the environment: flags show in ps)")
	pf.StringVar(&g.cloud, "os-cloud", "", "cloud of clouds.yaml to log in to Keystone with (env OS_CLOUD)")
	pf.StringVarP(&g.output, "format", "f", outTable, "output format: table, json, yaml, value or csv")
	pf.StringVarP(&g.output, "output", "o", outTable, "the same as -f (diagnose: the file to write)")
	pf.StringArrayVarP(&g.columns, "column", "c", nil, "print this column (or field) only; repeat for more")
	pf.StringVar(&g.region, "os-region-name", "", "region of the catalog's endpoints (env OS_REGION_NAME)")
	pf.StringVar(&g.iface, "os-interface", "", "interface of the catalog's endpoints: public, internal or admin (env OS_INTERFACE)")
	pf.DurationVar(&g.timeout, "timeout", 30*time.Second, "how long one API call may take")
	formats := cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp)
	root.RegisterFlagCompletionFunc("format", formats)
	root.RegisterFlagCompletionFunc("output", formats)
	root.RegisterFlagCompletionFunc("os-interface", cobra.FixedCompletions([]string{"public", "internal", "admin"}, cobra.ShellCompDirectiveNoFileComp))

	for _, f := range []func(*globals) *cobra.Command{
		versionCmd, healthCmd,
		hostsCmd, gpusCmd, instancesCmd, allocationsCmd, eventsCmd, deadLettersCmd,
		requestsCmd, requestCmd, placeCmd, syncCmd, policyCmd, webhookCmd,
		driftCmd, flavorCmd, diagnoseCmd,
		gpuCmd,   // one GPU: retype
		fleetCmd, // rolling vGPU-manager upgrades
		hostCmd,  // host maintenance: migrate-all
		usageCmd, // accounting: GET /v1/usage
		quotaCmd, // limits and usage: GET /v1/quota
	} {
		root.AddCommand(f(g))
	}
	// Operator controls: pause, resume, observe-only, drain, undrain, controls, audit, profiles.
	root.AddCommand(append(controlsCmds(g), auditCmd(g), profilesCmd(g))...)
	root.AddCommand(manpage.Command("1"))
	for _, c := range root.Commands() {
		if c.Name() == "dead-letters" {
			c.AddCommand(deadLetterReplayCmd(g))
		}
	}
	root.AddCommand(completionCmd(root))
	setUsageArgs(root)
	return root
}

// setUsageArgs makes every positional-argument error exit 2.
func setUsageArgs(c *cobra.Command) {
	if v := c.Args; v != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := v(cmd, args); err != nil {
				return usageErr(err)
			}
			return nil
		}
	}
	for _, s := range c.Commands() {
		setUsageArgs(s)
	}
}

// defaultURL is where the bridge is looked for when nothing says.
const defaultURL = "http://127.0.0.1:9797"

// api returns the client, built once from the flags and the environment.
func (g *globals) api() *apiclient.Client {
	if g.client != nil {
		return g.client
	}
	cfg := apiclient.Config{URL: g.url, Token: g.token, Timeout: g.timeout, UserAgent: "vgpuctl/" + version}
	if cfg.Token == "" {
		cfg.Token = os.Getenv("VGPUCTL_TOKEN")
	}
	if g.cacert != "" {
		hc, err := caClient(g.cacert, g.timeout)
		if err != nil {
			// Every call fails with it: the CA named cannot be used.
			hc = &http.Client{Transport: errTransport{err}}
		}
		cfg.HTTPClient = hc
	}
	what, parse, ok := g.keystone()
	switch {
	case cfg.Token == "" && ok:
		cfg.Login = apiclient.KeystoneLogin(what, parse) // the URL too, when none is given
	case cfg.URL == "":
		cfg.URL = defaultURL
	}
	g.client = apiclient.New(cfg)
	return g.client
}

// keystone says where the Keystone credentials come from, as the
// openstack client reads them: a cloud of clouds.yaml (--os-cloud, else
// OS_CLOUD), else the OS_* variables of an openrc file (OS_AUTH_URL set);
// --os-cacert, --os-region-name and --os-interface override either. what
// names the source in errors; ok is false when there is none.
func (g *globals) keystone() (what string, parse func() (osclient.Cloud, error), ok bool) {
	var opts []clouds.ParseOption
	if g.cacert != "" {
		opts = append(opts, clouds.WithCACertPath(g.cacert))
	}
	if g.region != "" {
		opts = append(opts, clouds.WithRegion(g.region))
	}
	if g.iface != "" {
		opts = append(opts, clouds.WithEndpointType(g.iface))
	}
	if cloud := g.cloudName(); cloud != "" {
		return "cloud " + cloud, func() (osclient.Cloud, error) {
			c, err := osclient.ParseCloud(cloud, opts...)
			if err != nil {
				return c, fmt.Errorf("clouds.yaml: %w", err)
			}
			return c, nil
		}, true
	}
	if osclient.HasEnv(os.Getenv) {
		return "OS_* variables", func() (osclient.Cloud, error) {
			c, err := osclient.ParseEnv(os.Getenv, opts...)
			if err != nil {
				return c, fmt.Errorf("OS_* variables: %w", err)
			}
			return c, nil
		}, true
	}
	return "", nil, false
}

// caClient is an HTTP client that trusts the CAs of file.
func caClient(file string, timeout time.Duration) (*http.Client, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--os-cacert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--os-cacert %s: no PEM certificate in it", file)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	return &http.Client{Transport: tr, Timeout: timeout}, nil
}

// errTransport fails every request with err.
type errTransport struct{ err error }

func (t errTransport) RoundTrip(*http.Request) (*http.Response, error) { return nil, t.err }

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ee exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case apiclient.IsUnreachable(err):
		return exitNoAPI
	}
	if _, ok := apiclient.AsError(err); ok {
		return exitFailure
	}
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires ", "invalid argument", "flag needs an argument", "required flag"} {
		if strings.HasPrefix(msg, p) {
			return exitUsage
		}
	}
	return exitFailure
}

// printError writes "vgpuctl: title: detail", each invalid field on its own
// line, and the request id the bridge logged it under.
func printError(w io.Writer, err error) {
	fmt.Fprintln(w, "vgpuctl:", err)
	if e, ok := apiclient.AsError(err); ok && e.Problem.RequestID != "" {
		fmt.Fprintln(w, "  request id:", e.Problem.RequestID)
	}
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(g.stdout, buildversion.String("vgpuctl"))
			return nil
		},
	}
}

func healthCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "Show the bridge's readiness (exit 3 when not ready, 4 when unreachable)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := g.api().Ready(cmd.Context())
			if err != nil && apiclient.StatusCode(err) != 503 {
				return err
			}
			if perr := g.emit(r.Raw, func(w io.Writer) {
				header(w, "CHECK", "STATE")
				for _, k := range sortedKeys(r.Checks) {
					row(w, k, r.Checks[k])
				}
			}); perr != nil {
				return perr
			}
			if err != nil {
				return exitError{exitNotReady, fmt.Errorf("not ready: %w", err)}
			}
			return nil
		},
	}
}

func completionCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: `Print a shell completion script.

  bash:  source <(vgpuctl completion bash)      # or write it to /etc/bash_completion.d/vgpuctl
  zsh:   vgpuctl completion zsh > "${fpath[1]}/_vgpuctl"
  fish:  vgpuctl completion fish > ~/.config/fish/completions/vgpuctl.fish`,
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"bash", "zsh", "fish"},
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(w, true)
			case "zsh":
				return root.GenZshCompletion(w)
			default:
				return root.GenFishCompletion(w, true)
			}
		},
	}
}

// flagChanged reports whether the user set the flag.
func flagChanged(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}
