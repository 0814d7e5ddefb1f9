package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

var driftKinds = []string{"orphan_mdev", "missing_device", "stale_claim", "unclaimed_device", "unknown_instance"}

func driftCmd(g *globals) *cobra.Command {
	var f apiclient.DriftFilter
	var runNow bool
	cmd := &cobra.Command{
		Use:   "drift",
		Short: "Show where Placement, the hosts and the bridge disagree",
		Long: `Show the drift reconciler's findings: differences between Placement's VGPU
allocations, the agents' reports (mdevs, active vGPUs) and the bridge's own
records. Kinds: orphan_mdev (an agent-made mdev no vGPU accounts for),
missing_device (an attached vGPU the host does not show), stale_claim (a
claim nothing accounts for, e.g. of a deleted instance), unclaimed_device (a
vGPU without its Placement claim), unknown_instance (a vGPU of an instance the
bridge has no record of). With [drift] repair = true the bridge removes orphan
mdevs and releases its own stale claims; REPAIRED says so.

--run runs the reconciler first (admin).`,
		Example: `  vgpuctl drift
  vgpuctl drift --kind orphan_mdev --host compute-1
  vgpuctl drift --run -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runNow {
				run, err := g.api().DriftRunNow(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintf(g.stderr, "drift run %d: %d finding(s), %d new, %d resolved, %d repair(s)\n",
					run.ID, run.Findings, run.New, run.Resolved, run.Repairs)
			}
			dl, err := g.api().Drift(cmd.Context(), f)
			if err != nil {
				return err
			}
			return g.emit(dl.Raw, func(w io.Writer) {
				header(w, "ID", "KIND", "HOST", "GPU", "INSTANCE", "MDEV", "REPAIRABLE", "REPAIRED", "FIRST SEEN", "LAST SEEN", "DETAIL")
				for _, d := range dl.Findings {
					repaired := yesNo(d.Repaired)
					if d.ResolvedAt != nil {
						repaired += " (resolved)"
					}
					row(w, fmt.Sprint(d.ID), d.Kind, str(d.Host), str(d.PCIAddress), str(d.InstanceUUID), str(d.MdevUUID),
						yesNo(d.Repairable), repaired, ts(d.FirstSeen), ts(d.LastSeen), clip(d.Detail, 80))
				}
				if dl.LastRun != nil {
					fmt.Fprintf(w, "\nlast run %s by %s: %d open, %d repair(s); repair %s, every %s\n", ts(dl.LastRun.FinishedAt),
						dl.LastRun.Replica, dl.LastRun.Findings, dl.LastRun.Repairs, onOff(dl.Repair), dl.Interval)
				}
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.State, "state", "", "open (default), resolved or all")
	fl.StringVar(&f.Kind, "kind", "", "only this kind: "+fmt.Sprint(driftKinds))
	fl.StringVar(&f.Host, "host", "", "only findings of this compute host")
	fl.IntVar(&f.Limit, "limit", 0, "most findings (1-1000; the bridge's default is 100)")
	fl.BoolVar(&runNow, "run", false, "run the reconciler now, then list (admin)")
	cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions(driftKinds, cobra.ShellCompDirectiveNoFileComp))
	cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{"open", "resolved", "all"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
