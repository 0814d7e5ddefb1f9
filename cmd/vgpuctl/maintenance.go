// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

// hostCmd is `vgpuctl host`: host maintenance.
func hostCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Host maintenance: move every vGPU VM off a host (admin); the nova.conf of Nova-owned VFs (layout)",
	}
	cmd.AddCommand(migrateAllCmd(g), maintenanceCmd(g), hostLayoutCmd(g))
	return cmd
}

func migrateAllCmd(g *globals) *cobra.Command {
	var b apiclient.MigrateAll
	var keepGoing, wait bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "migrate-all HOST",
		Short: "Drain HOST, move every VM holding a vGPU off it through Nova, undrain it (admin, audited)",
		Long: `Drain HOST, move every VM holding a vGPU off it, and undrain it when done
(a host drained already stays drained).

A VM whose vGPU comes from its flavor (resources:VGPU) is cold-migrated and
confirmed; with [maintenance] live_migrate_vgpu = true (Nova 2024.1+,
libvirt 8.6+, QEMU 8.1+) it is live-migrated. A VM whose vGPU the bridge
attached has it detached through the agent, is live-migrated without it,
and gets a vGPU of the same profile on the target, reserved there in
Placement before the move. A move that fails leaves the VM on HOST with its
vGPU; the reservation is released.

--dry-run shows the plan and changes nothing. The operation runs in the
bridge: without --wait the command prints it and returns; vgpuctl host
maintenance HOST shows its progress. With --wait, exit 5 when a VM failed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if b.Concurrency < 1 || b.Concurrency > 16 {
				return usageErr(fmt.Errorf("--concurrency %d: want 1 to 16", b.Concurrency))
			}
			stop := !keepGoing
			b.StopOnFailure = &stop
			p, op, err := g.api().MigrateAllHost(cmd.Context(), args[0], b)
			if err != nil {
				return err
			}
			if p != nil {
				return g.emit(p.Raw, func(w io.Writer) { fmt.Fprint(w, p.Text) })
			}
			if !wait {
				return g.emit(op.Raw, func(w io.Writer) { operationTable(w, *op) })
			}
			end, err := g.watchOperation(cmd.Context(), op.ID, interval)
			if err != nil {
				return err
			}
			if err := g.emit(end.Raw, func(w io.Writer) { operationTable(w, end) }); err != nil {
				return err
			}
			if end.State != "succeeded" {
				return exitError{exitRequest, fmt.Errorf("operation %s ended %s", end.ID, end.State)}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&b.DryRun, "dry-run", false, "show what would happen; change nothing")
	fl.IntVar(&b.Concurrency, "concurrency", 1, "VMs moved at once (1 to 16)")
	fl.BoolVar(&keepGoing, "keep-going", false, "go on with the other VMs after a VM failed (default: stop starting VMs)")
	fl.BoolVar(&wait, "wait", false, "follow the progress until the operation ends")
	fl.StringVar(&b.Target, "target", "", "the host to move to (default: Nova's scheduler for flavor vGPUs, a host with room for the bridge's)")
	fl.DurationVar(&interval, "interval", 2*time.Second, "with --wait: time between polls")
	return cmd
}

func maintenanceCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "maintenance HOST|OPERATION_ID",
		Short: "Show a host's latest maintenance operation (or one by id) with each VM's progress",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var op apiclient.MaintenanceOperation
			var err error
			if looksLikeUUID(args[0]) {
				op, err = g.api().Maintenance(cmd.Context(), args[0])
			} else {
				op, err = g.api().HostMaintenance(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			return g.emit(op.Raw, func(w io.Writer) { operationTable(w, op) })
		},
	}
}

func looksLikeUUID(s string) bool {
	return len(s) == 36 && strings.Count(s, "-") == 4
}

// watchOperation polls the operation until it ends; each VM's change of
// state is a line on stderr.
func (g *globals) watchOperation(ctx context.Context, id string, interval time.Duration) (apiclient.MaintenanceOperation, error) {
	seen := map[string]string{}
	for {
		op, err := g.api().Maintenance(ctx, id)
		if err != nil {
			return op, err
		}
		for _, v := range op.VMs {
			if seen[v.Instance] != v.State {
				seen[v.Instance] = v.State
				line := fmt.Sprintf("%s %s (%s): %s", ts(time.Now()), orDash(v.Name), v.Instance, v.State)
				if v.Reason != "" && (v.State == "failed" || v.Action == "skip") {
					line += ": " + v.Reason
				}
				fmt.Fprintln(g.stderr, line)
			}
		}
		if op.State != "running" {
			return op, nil
		}
		select {
		case <-ctx.Done():
			return op, ctx.Err()
		case <-time.After(max(interval, 100*time.Millisecond)):
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func operationTable(w io.Writer, op apiclient.MaintenanceOperation) {
	kv(w, "Operation", op.ID, "Host", op.Host, "State", op.State, "Drained by it", yesNo(op.DrainedByOp), "By", op.CreatedBy,
		"Started", ts(op.CreatedAt), "Finished", tsp(op.FinishedAt))
	fmt.Fprintln(w)
	header(w, "INSTANCE", "NAME", "PATH", "ACTION", "TARGET", "STATE", "REASON")
	for _, v := range op.VMs {
		row(w, v.Instance, orDash(v.Name), orDash(v.Path), v.Action, orDash(v.Target), v.State, clip(v.Reason, 80))
	}
}
