// Command vgpuctl is the operator's command line for the vgpu-bridge API.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"
)

// Set by the linker.
var (
	version = "dev"
	commit  = "unknown"
)

// Exit codes scripts can rely on.
const (
	exitOK       = 0
	exitFailure  = 1 // the API answered with an error, or the command failed
	exitUsage    = 2 // bad flags or arguments
	exitNotReady = 3 // health: the bridge answered but is not ready
	exitNoAPI    = 4 // the API could not be reached
)

type globals struct {
	url, token, output string
	timeout            time.Duration
	stdout, stderr     io.Writer
}

type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "vgpuctl",
		Short:         "Operate vgpu-bridge through its API",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return exitError{exitUsage, err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.url, "url", envOr("VGPUCTL_URL", "http://127.0.0.1:9797"), "base URL of the bridge API (env VGPUCTL_URL)")
	pf.StringVar(&g.token, "token", "", "API token (env VGPUCTL_TOKEN; prefer the environment: flags show in ps)")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table, json or yaml")
	pf.DurationVar(&g.timeout, "timeout", 30*time.Second, "how long one API call may take")
	root.AddCommand(versionCmd(g), healthCmd(g))
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "vgpuctl:", err)
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "accepts ") {
		return exitUsage
	}
	return exitFailure
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintf(g.stdout, "vgpuctl %s (commit %s, %s %s/%s)\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
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
			var body map[string]any
			status, err := g.get(cmd.Context(), "/readyz", &body)
			if err != nil {
				return exitError{exitNoAPI, err}
			}
			checks := map[string]string{}
			if c, ok := body["checks"].(map[string]any); ok {
				for k, v := range c {
					checks[k] = fmt.Sprint(v)
				}
			}
			for _, p := range asList(body["invalid_params"]) {
				checks[fmt.Sprint(p["name"])] = fmt.Sprint(p["reason"])
			}
			if err := g.print(body, []string{"CHECK", "STATE"}, sortedRows(checks)); err != nil {
				return err
			}
			if status != http.StatusOK {
				return exitError{exitNotReady, fmt.Errorf("not ready (%d)", status)}
			}
			return nil
		},
	}
}

func asList(v any) []map[string]any {
	var out []map[string]any
	l, _ := v.([]any)
	for _, x := range l {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func sortedRows(m map[string]string) [][]string {
	rows := make([][]string, 0, len(m))
	for k, v := range m {
		rows = append(rows, []string{k, v})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i][0] < rows[j][0] })
	return rows
}

func (g *globals) get(ctx context.Context, path string, out any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(g.url, "/")+path, nil)
	if err != nil {
		return 0, err
	}
	tok := g.token
	if tok == "" {
		tok = os.Getenv("VGPUCTL_TOKEN")
	}
	if tok != "" {
		req.Header.Set("X-Auth-Token", tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("cannot reach %s: %w", g.url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
		return resp.StatusCode, fmt.Errorf("%s answered %s with a body that is not JSON", g.url, resp.Status)
	}
	return resp.StatusCode, nil
}

func (g *globals) print(raw any, header []string, rows [][]string) error {
	switch g.output {
	case "json":
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(raw)
	case "yaml":
		return yaml.NewEncoder(g.stdout).Encode(raw)
	case "table":
		tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(header, "\t"))
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		return tw.Flush()
	}
	return exitError{exitUsage, fmt.Errorf("output format %q: use table, json or yaml", g.output)}
}
