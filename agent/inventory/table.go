package inventory

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints inv for people: one block per GPU, then domains.
func WriteTable(w io.Writer, inv *Inventory) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	nv := "yes"
	if !inv.NVML {
		nv = "no"
		if inv.NVMLError != "" {
			nv += " (" + inv.NVMLError + ")"
		}
	}
	fmt.Fprintf(tw, "HOST\t%s\n", inv.Host)
	fmt.Fprintf(tw, "DRIVER\t%s\n", strings.Join(inv.DriverVersions, ", "))
	fmt.Fprintf(tw, "NVML\t%s\n", nv)
	fmt.Fprintf(tw, "CGROUP\t%s\n\n", inv.CgroupVersion)
	fmt.Fprintln(tw, "GPU\tNAME\tMODE\tHEALTH\tUTIL\tFB USED/TOTAL MiB\tTEMP\tPOWER W\tENABLED TYPE")
	for _, g := range inv.GPUs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d%%\t%d/%d\t%dC\t%.0f\t%s\n", g.Addr, dash(g.Name), g.Mode, g.Health,
			g.Utilization.GPU, g.Memory.Used>>20, g.Memory.Total>>20, g.TemperatureC, float64(g.PowerMW)/1000, dash(g.EnabledType))
	}
	for _, g := range inv.GPUs {
		fmt.Fprintf(tw, "\n%s types\tNAME\tCLASS\tFB MiB\tMAX\tIN USE\tAVAILABLE\tALLOWED\n", g.Addr)
		for _, t := range g.Types {
			if t.InUse == 0 && t.Available == 0 && !t.Allowed && t.Refused == "" {
				continue
			}
			allowed := fmt.Sprint(t.Allowed)
			if t.Refused != "" {
				allowed = "refused"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", t.ID, t.Name, dash(t.Class), t.FramebufferMB, t.MaxInstances, t.InUse, t.Available, allowed)
		}
		for _, t := range g.Types {
			if t.Refused != "" {
				fmt.Fprintf(tw, "  %s refused\t%s\n", t.ID, t.Refused)
			}
		}
		if len(g.VGPUs) > 0 {
			fmt.Fprintf(tw, "%s vGPUs\tTYPE\tINSTANCE\tDOMAIN\tLIVE\tFB MiB\tLICENSED\n", g.Addr)
			for _, v := range g.VGPUs {
				lic := "-"
				if v.Licensed != nil {
					lic = fmt.Sprint(*v.Licensed)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%v\t%d\t%s\n", v.ID, v.Type, dash(v.Instance), dash(v.DomainName), v.Live, v.FBUsage>>20, lic)
			}
		}
	}
	if len(inv.Domains) > 0 {
		fmt.Fprintln(tw, "\nDOMAIN\tUUID\tSTATE\tVGPUS")
		for _, d := range inv.Domains {
			var devs []string
			devs = append(devs, d.Mdevs...)
			for _, a := range d.VFs {
				devs = append(devs, a.String())
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.Name, d.UUID, d.State, dash(strings.Join(devs, ",")))
		}
	}
	if len(inv.Orphans) > 0 {
		fmt.Fprintf(tw, "\nORPHANS\t%s\n", strings.Join(inv.Orphans, ", "))
	}
	for _, e := range inv.Errors {
		fmt.Fprintf(tw, "ERROR\t%s\n", e)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
