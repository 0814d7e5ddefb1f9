package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
)

func newLayoutCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "layout",
		Short: "Apply or check the boot VF layout of Nova-owned GPUs ([devices] vf_layout)",
		Long: `layout applies [devices] vf_layout, the VF layout of the vendor-VFIO GPUs
whose VFs Nova owns (listed in Nova's [pci] device_spec): it enables each
PF's VFs (sriov_numvfs, from 0) and types the VFs in address order
(nvidia/current_vgpu_type). vgpu-agent-layout.service runs "layout apply"
at boot, before nova-compute and libvirtd. A VF already of the right type
is left alone; a VF of another type is never changed; a layout the GPU
cannot hold is refused before any VF is typed.
Exit status: 0 applied (or nothing to do), 1 refused or failed (the reason
is printed), 2 a bad configuration.`,
	}
	c.AddCommand(newLayoutRunCmd(g, "apply", "Enable and type the VFs of [devices] vf_layout (idempotent)", false),
		newLayoutRunCmd(g, "check", "Print what apply would do, writing nothing (VFs not yet enabled are checked only by apply)", true))
	return c
}

func newLayoutRunCmd(g *globals, use, short string, dry bool) *cobra.Command {
	var output string
	var o agent.LayoutOptions
	o.DryRun = dry
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			v, err := g.Load()
			if err != nil {
				return err
			}
			res, err := agent.ApplyLayout(cmd.Context(), v, o, g.Logger(v))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return writeJSON(out, res)
			}
			verb := ""
			if dry {
				verb = "would "
			}
			for _, st := range res.Steps {
				if st.Action == "keep" {
					fmt.Fprintf(out, "%s\n", st)
					continue
				}
				fmt.Fprintf(out, "%s%s\n", verb, st)
			}
			for _, w := range res.Warnings {
				fmt.Fprintf(out, "warning: %s\n", w)
			}
			for _, pf := range res.Pending {
				fmt.Fprintf(out, "pending %s: VFs not enabled yet; their types are checked by apply, before any VF is typed\n", pf)
			}
			if len(res.Steps) == 0 {
				fmt.Fprintln(out, "nothing to do: [devices] vf_layout is empty")
			}
			return nil
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	c.Flags().StringVar(&o.FakeHostDir, "fake-host", "", "act on the simulated host under DIR (as `serve --fake-host DIR`)")
	return c
}
