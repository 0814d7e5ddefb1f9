// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

// fleetCmd is `vgpuctl fleet`: work over several hosts.
func fleetCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "fleet", Short: "Work over several hosts: rolling vGPU-manager upgrades, Nova GPU re-types (admin)"}
	cmd.AddCommand(fleetUpgradeCmd(g), fleetUpgradeStatusCmd(g), fleetRetypeCmd(g))
	return cmd
}

func fleetUpgradeCmd(g *globals) *cobra.Command {
	var b apiclient.FleetUpgradeBody
	var hosts string
	var keepGoing, wait bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "upgrade --to BRANCH --hosts H1,H2",
		Short: "Upgrade the vGPU manager of hosts one at a time: drain, move the VMs, upgrade, check, undrain (admin, audited)",
		Long: `Upgrade the vGPU manager (host driver) of the listed hosts, at most
--max-unavailable at a time. Each host is checked against the
driver-compatibility data ([policy] driver_compat_file: the guests' drivers
its agent last reported), drained, its vGPU VMs moved off (as vgpuctl host
migrate-all does), sent upgrade_driver (the agent runs its own [DEFAULT]
driver_upgrade_command; the bridge sends only the branch), awaited until
its agent reports the target branch, checked with the agent's diagnostics
(no error or critical finding), and undrained (unless it was drained
before).

--dry-run shows the hosts and any guest driver the target cannot serve, and
changes nothing; run it first. The run is kept in the bridge and resumes
after a restart; the first failure stops it (its host stays drained, its
VMs elsewhere) unless --keep-going. With --wait, exit 5 when it failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					b.Hosts = append(b.Hosts, h)
				}
			}
			if b.Branch == "" || len(b.Hosts) == 0 {
				return usageErr(fmt.Errorf("--to and --hosts are required"))
			}
			stop := !keepGoing
			b.StopOnFailure = &stop
			p, op, err := g.api().StartFleetUpgrade(cmd.Context(), b)
			if err != nil {
				return err
			}
			if p != nil {
				return g.emit(p.Raw, func(w io.Writer) { fleetPlanTable(w, b, *p) })
			}
			return g.followFleetRun(cmd, "upgrade", *op, wait, interval)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&b.Branch, "to", "", "the target driver branch (e.g. 570)")
	fl.StringVar(&b.Version, "version", "", "the exact target version (e.g. 570.133.10); default: any of the branch")
	fl.StringVar(&hosts, "hosts", "", "the hosts, comma-separated, in the order to upgrade them")
	fl.IntVar(&b.MaxUnavailable, "max-unavailable", 1, "hosts out of service at once")
	fl.BoolVar(&b.DryRun, "dry-run", false, "show what would happen; change nothing")
	fl.BoolVar(&keepGoing, "keep-going", false, "go on with the other hosts after a host failed")
	fl.BoolVar(&wait, "wait", false, "follow the progress until the run ends")
	fl.DurationVar(&interval, "interval", 5*time.Second, "with --wait: time between polls")
	return cmd
}

func fleetUpgradeStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "upgrade-status ID",
		Short: "Show a fleet upgrade with each host's step",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			op, err := g.api().FleetUpgrade(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.emit(op.Raw, func(w io.Writer) { fleetUpgradeTable(w, op) })
		},
	}
}

func (g *globals) watchFleetUpgrade(cmd *cobra.Command, id string, interval time.Duration) (apiclient.FleetUpgrade, error) {
	seen := map[string]string{}
	for {
		op, err := g.api().FleetUpgrade(cmd.Context(), id)
		if err != nil {
			return op, err
		}
		for _, h := range op.Hosts {
			if seen[h.Host] != h.State {
				seen[h.Host] = h.State
				line := fmt.Sprintf("%s %s: %s", ts(time.Now()), h.Host, h.State)
				if h.Error != "" {
					line += ": " + h.Error
				}
				fmt.Fprintln(g.stderr, line)
			}
		}
		if op.State != "running" {
			return op, nil
		}
		select {
		case <-cmd.Context().Done():
			return op, cmd.Context().Err()
		case <-time.After(max(interval, 100*time.Millisecond)):
		}
	}
}

func fleetPlanTable(w io.Writer, b apiclient.FleetUpgradeBody, p apiclient.FleetUpgradePlan) {
	fmt.Fprintf(w, "Dry run: upgrade to branch %s, %d host(s) at a time. Nothing was changed.\n\n", b.Branch, b.MaxUnavailable)
	header(w, "HOST", "DRIVER", "DRAINED", "VGPUS")
	for _, h := range p.Hosts {
		row(w, h.Host, orDash(h.Driver), yesNo(h.Drained), fmt.Sprint(h.VGPUs))
	}
	fmt.Fprintln(w, "\nOn each host:")
	for i, s := range p.Steps {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
	if len(p.Refusals) > 0 {
		fmt.Fprintf(w, "\nREFUSED: branch %s cannot serve these guests' drivers:\n", b.Branch)
		header(w, "HOST", "INSTANCE", "GUEST DRIVER", "REASON")
		for _, r := range p.Refusals {
			row(w, r.Host, orDash(r.Instance), r.Guest, clip(r.Reason, 80))
		}
	}
}

func fleetUpgradeTable(w io.Writer, op apiclient.FleetUpgrade) {
	kv(w, "Fleet upgrade", op.ID, "Branch", op.Branch+orEmpty(" ("+op.Version+")", op.Version), "State", op.State,
		"Max unavailable", fmt.Sprint(op.MaxUnavailable), "Stop on failure", yesNo(op.StopOnFailure), "By", op.CreatedBy,
		"Started", ts(op.CreatedAt), "Finished", tsp(op.FinishedAt), "Error", orDash(op.Error))
	fmt.Fprintln(w)
	if op.Kind == "retype" {
		header(w, "HOST", "STATE", "GPUS", "ERROR")
		for _, h := range op.Hosts {
			var gpus []string
			if h.Retype != nil {
				for _, x := range h.Retype.GPUs {
					gpus = append(gpus, x.PCI+"="+x.To)
				}
			}
			row(w, h.Host, h.State, orDash(strings.Join(gpus, " ")), clip(orDash(h.Error), 80))
		}
		return
	}
	header(w, "HOST", "STATE", "FROM", "TO", "ERROR")
	for _, h := range op.Hosts {
		row(w, h.Host, h.State, orDash(h.FromDriver), orDash(h.ToDriver), clip(orDash(h.Error), 80))
	}
}

func orEmpty(s, cond string) string {
	if cond == "" {
		return ""
	}
	return s
}

// followFleetRun prints a started fleet run (kind: upgrade or retype),
// after following it to its end with wait; a run followed to an end other
// than done exits exitRequest.
func (g *globals) followFleetRun(cmd *cobra.Command, kind string, op apiclient.FleetUpgrade, wait bool, interval time.Duration) error {
	if wait {
		end, err := g.watchFleetUpgrade(cmd, op.ID, interval)
		if err != nil {
			return err
		}
		op = end
	}
	if err := g.emit(op.Raw, func(w io.Writer) { fleetUpgradeTable(w, op) }); err != nil {
		return err
	}
	if wait && op.State != "done" {
		return exitError{exitRequest, fmt.Errorf("fleet %s %s ended %s: %s", kind, op.ID, op.State, op.Error)}
	}
	return nil
}
