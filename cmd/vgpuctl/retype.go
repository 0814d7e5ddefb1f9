package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// gpuCmd groups what is done to one GPU by its host and PCI address.
func gpuCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "gpu", Short: "Act on one GPU of a host (HOST/PF)"}
	cmd.AddCommand(gpuRetypeCmd(g))
	return cmd
}

func gpuRetypeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "retype HOST/PF TYPE",
		Short: "Re-type an empty bridge-owned GPU (admin, audited)",
		Long: `Re-type a GPU of [placement] bridge_owned_gpus that holds no vGPU of the
bridge to another type its agent reports creatable: a vendor-VFIO type on a
VF GPU, e.g. vgpuctl gpu retype compute-1/0000:c1:00.0 1430, an mdev type
on an mdev GPU, e.g. vgpuctl gpu retype compute-1/0000:d8:00.0 nvidia-230. The GPU's provider stops
offering the old type first, the bridge records the new type, then the new
type's inventory and trait are published; a bridge stopped on the way
finishes the re-type when it publishes its GPUs again. With [placement]
retype_on_demand the bridge does the same by itself for a direct-path
request that finds no capacity of its type on the instance's host.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			i := strings.LastIndex(args[0], "/")
			if i <= 0 || i == len(args[0])-1 {
				return fmt.Errorf("%q: want HOST/PF, e.g. compute-1/0000:c1:00.0", args[0])
			}
			res, err := g.api().RetypeGPU(cmd.Context(), args[0][:i], args[0][i+1:], args[1])
			if err != nil {
				return err
			}
			return g.emit(res.Raw, func(w io.Writer) {
				kv(w, "Host", res.Host, "PCI", res.PCI, "Type", res.TypeID, "Step", res.Step)
			})
		},
	}
}
