package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
)

func newUpgradeCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "upgrade",
		Short: "Check a deployment before (or after) upgrading the bridge",
	}
	c.AddCommand(&cobra.Command{
		Use:   "check",
		Short: "Check what this release needs: schema, Nova notifications, Placement, typed GPU providers, agents, keys",
		Long: "Like nova-status upgrade check: each check says Success, Warning or Failure with details, and the " +
			"command exits 0 when all succeed, 1 when the worst is a warning, 2 when one failed, and 255 when the " +
			"checks could not run (no database). It changes nothing.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			checks, err := bridge.UpgradeCheck(cmd.Context(), v)
			if err != nil {
				fmt.Fprintln(g.Stderr, "vgpu-bridge: upgrade check:", err)
				return exitCode(255)
			}
			tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CHECK\tRESULT\tDETAILS")
			worst := bridge.CheckSuccess
			for _, c := range checks {
				details := c.Details
				if details == "" {
					details = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Result, details)
				worst = max(worst, c.Result)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if worst != bridge.CheckSuccess {
				return exitCode(int(worst))
			}
			return nil
		},
	})
	return c
}
