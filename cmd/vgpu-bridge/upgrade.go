package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
)

func newUpgradeCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "upgrade",
		Short: "Check a deployment before (or after) upgrading the bridge",
	}
	var asJSON bool
	check := &cobra.Command{
		Use:   "check",
		Short: "Check what this release needs: schema, Nova notifications, Placement, typed GPU providers, agents, keys",
		Long: "Like nova-status upgrade check: each check says Success, Warning or Failure with details, and the " +
			"command exits 0 when all succeed, 1 when the worst is a warning, 2 when one failed, and 255 when the " +
			"checks could not run (no database). With --json it prints oslo.upgradecheck's JSON: " +
			`{"name": ..., "checks": [{"check": NAME, "result": 0|1|2, "details": TEXT}]}. It changes nothing.`,
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
			worst := bridge.CheckSuccess
			for _, c := range checks {
				worst = max(worst, c.Result)
			}
			if asJSON {
				err = printChecksJSON(g.Stdout, checks)
			} else {
				err = printChecks(g.Stdout, checks)
			}
			if err != nil {
				return err
			}
			if worst != bridge.CheckSuccess {
				return exitCode(int(worst))
			}
			return nil
		},
	}
	check.Flags().BoolVar(&asJSON, "json", false, "print the results as JSON (oslo.upgradecheck's format) instead of a table")
	c.AddCommand(check)
	return c
}

func printChecks(w io.Writer, checks []bridge.Check) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAILS")
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Result, cmp.Or(c.Details, "-"))
	}
	return tw.Flush()
}

// printChecksJSON prints checks as oslo.upgradecheck's --json does
// (UpgradeCommands.check): the result is the exit code of the check.
func printChecksJSON(w io.Writer, checks []bridge.Check) error {
	type jsonCheck struct {
		Check   string `json:"check"`
		Result  int    `json:"result"`
		Details string `json:"details"`
	}
	out := struct {
		Name   string      `json:"name"`
		Checks []jsonCheck `json:"checks"`
	}{Name: "vgpu-bridge upgrade check", Checks: []jsonCheck{}}
	for _, c := range checks {
		out.Checks = append(out.Checks, jsonCheck{Check: c.Name, Result: int(c.Result), Details: c.Details})
	}
	return json.NewEncoder(w).Encode(out)
}
