package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

func quotaCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Show a project's vGPU limits and usage",
		Args:  cobra.NoArgs,
	}
	var project string
	show := &cobra.Command{
		Use:   "show",
		Short: "Show a project's vGPU limits and usage as the bridge sees them",
		Long: `Show a project's vGPU limits and usage as the bridge checks requests against
them (GET /v1/quota): the policy file's quota with the bridge's own count of
the project's vGPUs, and, with [quota] driver = unified_limits, Keystone's
unified limits: class:VGPU of the compute service (the limit Nova enforces on
flavors), counted from Placement as Nova counts it, and the bridge's
vgpu:<profile> limits. ORIGIN says where a limit comes from: project (a
project limit), registered (the service's registered limit) or none
(class:VGPU without either: 0, as Nova takes it).

A project-scoped token sees its own project's only; --project is needed
otherwise.`,
		Example: `  vgpuctl quota show
  vgpuctl quota show --project 6f0c7c1e0a2b4d1c9e8f7a6b5c4d3e2f -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := g.api().Quota(cmd.Context(), project)
			if err != nil {
				return err
			}
			return g.emit(q.Raw, func(w io.Writer) {
				header(w, "RESOURCE", "LIMIT", "USAGE", "ORIGIN")
				for _, l := range q.Limits {
					row(w, l.Resource, fmt.Sprint(l.Limit), fmt.Sprint(l.Usage), l.Origin)
				}
				row(w, "policy max_vgpus", unlimited(q.Policy.MaxVGPUs), fmt.Sprint(q.VGPUs), "policy file")
				row(w, "policy max_framebuffer_gib", unlimited(q.Policy.MaxFramebufferGiB),
					strings.TrimSuffix(fmt.Sprintf("%.2f", float64(q.FramebufferMiB)/1024), ".00"), "policy file")
				row(w, "policy max_vgpus_per_vm", unlimited(q.Policy.MaxVGPUsPerVM), "-", "policy file")
				allowed := "all"
				if len(q.Policy.AllowedProfiles) > 0 {
					allowed = strings.Join(q.Policy.AllowedProfiles, ",")
				}
				fmt.Fprintf(w, "\nproject %s; [quota] driver %s; profiles allowed: %s\n", q.ProjectID, q.Driver, allowed)
			})
		},
	}
	show.Flags().StringVar(&project, "project", "", "the project (id); default: the token's own project")
	cmd.AddCommand(show)
	return cmd
}

func unlimited(n int) string {
	if n == 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}
