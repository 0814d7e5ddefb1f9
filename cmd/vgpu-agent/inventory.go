package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/diagnose"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// hostFlags are the flags of commands that look at the host.
type hostFlags struct {
	output   string
	fakeHost string
}

func (f *hostFlags) add(c *cobra.Command) {
	c.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	c.Flags().StringVar(&f.fakeHost, "fake-host", "", "look at the simulated host under DIR (as `serve --fake-host DIR`)")
}

func (f *hostFlags) check() error { return checkOutput(f.output) }

// checkOutput refuses an -o other than table or json (a usage error: exit 2).
func checkOutput(output string) error {
	if output != "table" && output != "json" {
		return usageError{Err: fmt.Errorf("-o must be table or json, not %q", output)}
	}
	return nil
}

func (f *hostFlags) open(g *globals) (*agent.Drivers, *conf.Values, error) {
	if err := f.check(); err != nil {
		return nil, nil, err
	}
	v, err := g.Load()
	if err != nil {
		return nil, nil, err
	}
	var d *agent.Drivers
	if f.fakeHost != "" {
		d, err = agent.OpenFakeHost(f.fakeHost)
	} else {
		d, err = agent.OpenDriversToInspect(v, g.Logger(v))
	}
	if err != nil {
		return nil, nil, err
	}
	return d, v, nil
}

func writeJSON(w io.Writer, x any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(x)
}

func newInventoryCmd(g *globals) *cobra.Command {
	var f hostFlags
	c := &cobra.Command{
		Use:   "inventory",
		Short: "Show the host's GPUs, vGPU types, capacity, vGPUs and their instances",
		Long: `inventory scans sysfs (mediated devices and NVIDIA vendor VFIO), libvirt and
NVML once and prints what the agent reports to the bridge. Without NVML the
GPUs still show from sysfs, without telemetry.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, v, err := f.open(g)
			if err != nil {
				return err
			}
			defer d.Close()
			inv, err := d.Scanner(v).Scan(cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(g.Stdout, inv)
			}
			return inventory.WriteTable(g.Stdout, inv)
		},
	}
	f.add(c)
	return c
}

func newDiagnoseCmd(g *globals) *cobra.Command {
	var f hostFlags
	var checks []string
	c := &cobra.Command{
		Use:   "diagnose",
		Short: "Check the host for the classic vGPU failures (codes 43, 48, 62, 74 and more)",
		Long: `diagnose runs the host checks and prints each finding with its severity, the
evidence seen and a fix. Checks: ` + fmt.Sprint(diagnose.AllChecks) + `.
NVIDIA codes are labels: 43 is what a guest shows on a driver mismatch; 48, 62
and 74 label framebuffer exhaustion, hot-add failure and licence failure.
The exit status is 1 when a finding is an error or worse.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, v, err := f.open(g)
			if err != nil {
				return err
			}
			defer d.Close()
			r, err := d.Diagnoser(v).Run(cmd.Context(), checks)
			if err != nil {
				return usageError{Err: err}
			}
			if f.output == "json" {
				err = writeJSON(g.Stdout, r)
			} else {
				err = diagnose.WriteTable(g.Stdout, r)
			}
			if err != nil {
				return err
			}
			if r.Worst == diagnose.Error || r.Worst == diagnose.Critical {
				return fmt.Errorf("diagnose: worst finding is %s", r.Worst)
			}
			return nil
		},
	}
	f.add(c)
	c.Flags().StringSliceVar(&checks, "check", nil, "run only these checks (repeatable)")
	return c
}
