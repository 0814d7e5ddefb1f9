package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

func placeCmd(g *globals) *cobra.Command {
	var req apiclient.DryRunRequest
	var dry bool
	var required, forbidden []string
	cmd := &cobra.Command{
		Use:   "place --dry-run --profile PROFILE",
		Short: "Rank the GPUs able to hold a vGPU request, without claiming anything",
		Long: `Rank the GPUs able to hold a vGPU request, best first, with the reason each was
chosen. Nothing is claimed: the bridge places on its own when it acts, so
--dry-run is required. With --allow-retype, empty GPUs of another type that
could serve after re-typing follow, marked in the RETYPE column (operators
re-type; for a Nova-owned GPU the vgpuctl fleet retype command that
applies the nova.conf change follows the table).

  vgpuctl place --dry-run --profile T4-4Q --count 2 --strategy spread`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !dry {
				return usageErr(fmt.Errorf("place only runs dry: add --dry-run (the bridge claims on its own when it acts)"))
			}
			if req.Profile == "" && len(required) == 0 {
				return usageErr(fmt.Errorf("give --profile or --trait"))
			}
			if len(required)+len(forbidden) > 0 {
				req.Traits = &apiclient.Traits{Required: required, Forbidden: forbidden}
			}
			out, err := g.api().DryRun(cmd.Context(), req)
			if err != nil {
				return err
			}
			if err := g.emit(out.Raw, func(w io.Writer) {
				header(w, "#", "HOST", "PCI ADDRESS", "PROFILE", "AMOUNT", "FREE AFTER", "RETYPE", "REASON")
				for i, c := range out.Candidates {
					retype := ""
					if c.NeedsRetype {
						retype = "from " + c.RetypeFrom
						if c.RetypeFrom == "" {
							retype = "yes"
						}
					}
					free := itoa(c.FreeAfter)
					if c.Mode == apiclient.GPUModeMixed {
						free += " MiB" // framebuffer of a mixed GPU
					}
					row(w, itoa(i+1), c.Host, c.PCIAddress, c.Profile, itoa(c.Amount), free, retype, c.Reason)
				}
				if len(out.Rejected) > 0 {
					fmt.Fprintln(w, "\nMixed GPUs offering the type that cannot take it now:")
					for _, c := range out.Rejected {
						fmt.Fprintf(w, "  %s %s: %s\n", c.Host, c.PCIAddress, c.Reason)
					}
				}
				first := true
				for _, c := range out.Candidates {
					if c.RetypeCommand == "" {
						continue
					}
					if first {
						fmt.Fprintln(w, "\nRe-type a Nova-owned GPU host by host (add --dry-run to print its nova.conf change):")
						first = false
					}
					fmt.Fprintln(w, "  "+c.RetypeCommand)
				}
			}); err != nil {
				return err
			}
			if len(out.Candidates) == 0 && g.output == outTable {
				fmt.Fprintln(g.stderr, "no GPU can hold this request now")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&dry, "dry-run", false, "required: rank candidates without claiming")
	fl.StringVar(&req.Profile, "profile", "", "vGPU profile, e.g. T4-4Q")
	fl.StringSliceVar(&required, "trait", nil, "required trait instead of (or besides) --profile; repeatable")
	fl.StringSliceVar(&forbidden, "forbid-trait", nil, "forbidden trait; repeatable")
	fl.IntVar(&req.Count, "count", 0, "vGPUs wanted (default 1)")
	fl.StringVar(&req.Host, "host", "", "only this compute host or node")
	fl.StringVar(&req.Strategy, "strategy", "", "pack (fill GPUs) or spread (emptiest first); default: the bridge's")
	fl.BoolVar(&req.AllowRetype, "allow-retype", false, "also list empty GPUs of another type that could be re-typed")
	fl.IntVar(&req.Limit, "limit", 0, "most candidates (1-1000)")
	cmd.RegisterFlagCompletionFunc("strategy", cobra.FixedCompletions([]string{"pack", "spread"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
