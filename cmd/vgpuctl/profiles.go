package main

import (
	"io"

	"github.com/spf13/cobra"
)

func profilesCmd(g *globals) *cobra.Command {
	var series, gpu string
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "List the vGPU profile catalog with the fleet's GPUs typed for each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pl, err := g.api().Profiles(cmd.Context(), series, gpu)
			if err != nil {
				return err
			}
			return g.emit(pl.Raw, func(w io.Writer) {
				header(w, "NAME", "TYPE", "TRAIT", "FB MIB", "MAX", "SERIES", "GPU", "GPUS", "USED", "FREE")
				for _, p := range pl.Profiles {
					row(w, p.Name, p.TypeID, p.Trait, itoa(p.FramebufferMiB), itoa(p.MaxInstances), p.Series, p.GPU, itoa(p.GPUs), itoa(p.Used), itoa(p.Free))
				}
			})
		},
	}
	cmd.Flags().StringVar(&series, "series", "", "only this series: Q, C, B, A")
	cmd.Flags().StringVar(&gpu, "gpu", "", "only this GPU model, e.g. T4")
	return cmd
}
