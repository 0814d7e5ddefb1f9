package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

// newGenpolicyCmd writes the access rules with their defaults, as
// oslopolicy-sample-generator does for an OpenStack service; `make
// genconfig` runs it next to genconfig.
func newGenpolicyCmd(g *globals) *cobra.Command {
	var out, format string
	c := &cobra.Command{
		Use:   "genpolicy",
		Short: "Write the sample access policy (every rule, its default commented out) or its reference",
		Long: "genpolicy writes every operator API access rule with its default, in oslo.policy's language: " +
			"the sample policy file ([oslo_policy] policy_file), each rule commented out above the routes it " +
			"guards, or with --format rst the documentation's reference. The base rules' defaults are written " +
			"from the [keystone] role options' defaults.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			write := api.WriteSample
			switch format {
			case "yaml":
			case "rst":
				write = api.WriteReference
			default:
				return usageError{Err: fmt.Errorf("--format %q: want yaml or rst", format)}
			}
			w := g.Stdout
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			return write(w, bridge.AccessRoleNames())
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write (default: standard output)")
	c.Flags().StringVar(&format, "format", "yaml", "yaml (the sample policy file) or rst (the documentation's reference)")
	return c
}
