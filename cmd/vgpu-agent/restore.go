package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
)

func newRestoreCmd(g *globals) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "restore-devices",
		Short: "Recreate the mdevs and VF vGPU types the journal owns and the host lacks, then exit (at boot, before libvirtd)",
		Long: `restore-devices is the part of the reboot recovery that needs no libvirtd:
every mdev (same UUID, parent and type) and VF vGPU type the agent's journal
owns and the host lacks is created again through sysfs, so that the guests
libvirtd starts at boot find their vGPUs. vgpu-agent-restore.service runs it
before libvirtd; vgpu-agent serve, which needs libvirtd, starts after it.
It exits 1 when a device could not be recreated, and refuses to run while
an agent holds the journal.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			v, err := g.Load()
			if err != nil {
				return err
			}
			rec, err := agent.RestoreDevices(cmd.Context(), v, g.Logger(v))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				if err := writeJSON(out, rec); err != nil {
					return err
				}
			} else {
				for _, l := range []struct {
					what string
					keys []string
				}{{"present", rec.Present}, {"recreated", rec.Recreated}, {"failed", rec.Failed}, {"skipped", rec.Skipped}} {
					for _, k := range l.keys {
						fmt.Fprintf(out, "%-10s %s\n", l.what, k)
					}
				}
			}
			if len(rec.Failed) > 0 {
				return fmt.Errorf("%d owned device(s) could not be recreated: %v", len(rec.Failed), rec.Failed)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return c
}
