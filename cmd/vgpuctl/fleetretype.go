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

func fleetRetypeCmd(g *globals) *cobra.Command {
	var b apiclient.FleetRetypeBody
	var keepGoing, wait bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "retype --gpu HOST/PCI=TYPE [--gpu ...]",
		Short: "Re-type empty Nova-owned GPUs host by host: drain, apply the nova.conf change, verify in Placement, undrain (admin, audited)",
		Long: `Re-type Nova-owned mdev GPUs (their type comes from nova.conf [devices]
enabled_mdev_types and [mdev_<type>] device_addresses), one host at a time.
The bridge works out each host's nova.conf change from its agent's report
and Placement: the whole [devices] enabled_mdev_types line and every
[mdev_<type>] device_addresses section after the change. On each host the
GPUs must hold no vGPU (a GPU in use is refused); the host is drained (no VM
moves: the GPUs are empty), sent retype_gpus (the agent runs its own
[DEFAULT] gpu_retype_command with the change on its standard input), then
the bridge waits until each GPU's Placement provider carries the new type's
trait, and undrains the host (unless it was drained before).

--dry-run prints the plan and each host's nova.conf change, and changes
nothing: use it to apply the change by hand. The run is kept in the bridge
and resumes after a restart; the first failure stops it (its host stays
drained) unless --keep-going. With --wait, exit 5 when it failed. Follow a
run with vgpuctl fleet upgrade-status ID.

  vgpuctl fleet retype --gpu compute-1/0000:d8:00.0=nvidia-222 --dry-run`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(b.GPUs) == 0 {
				return usageErr(fmt.Errorf("--gpu HOST/PCI=TYPE is required"))
			}
			stop := !keepGoing
			b.StopOnFailure = &stop
			p, op, err := g.api().StartFleetRetype(cmd.Context(), b)
			if err != nil {
				return err
			}
			if p != nil {
				return g.emit(p.Raw, func(w io.Writer) { fleetRetypePlanTable(w, *p) })
			}
			return g.followFleetRun(cmd, "retype", *op, wait, interval)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&b.GPUs, "gpu", nil, "HOST/PCI=TYPE: the GPU and its new mdev type, e.g. compute-1/0000:d8:00.0=nvidia-222; repeatable")
	fl.BoolVar(&b.DryRun, "dry-run", false, "print the plan and the nova.conf changes; change nothing")
	fl.BoolVar(&keepGoing, "keep-going", false, "go on with the other hosts after a host failed")
	fl.BoolVar(&wait, "wait", false, "follow the progress until the run ends")
	fl.DurationVar(&interval, "interval", 5*time.Second, "with --wait: time between polls")
	return cmd
}

func fleetRetypePlanTable(w io.Writer, p apiclient.FleetRetypePlan) {
	fmt.Fprintf(w, "Dry run: re-type %d host(s), one at a time. Nothing was changed.\n\n", len(p.Hosts))
	header(w, "HOST", "DRAINED", "GPU", "FROM", "TO", "PROVIDER", "TRAIT")
	for _, h := range p.Hosts {
		for _, x := range h.Change.GPUs {
			row(w, h.Host, yesNo(h.Drained), x.PCI, orDash(x.From), x.To, orDash(x.ProviderUUID), orDash(x.FromTrait)+" -> "+x.ToTrait)
		}
	}
	fmt.Fprintln(w, "\nOn each host:")
	for i, s := range p.Steps {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
	for _, h := range p.Hosts {
		fmt.Fprintf(w, "\nnova.conf of %s after the change:\n\n%s", h.Host, strings.TrimRight(h.Change.Text, "\n")+"\n")
	}
}
