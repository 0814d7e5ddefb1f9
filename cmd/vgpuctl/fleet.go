package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// more tells a table reader how to get the next page.
func (g *globals) more(cursor string) {
	if cursor != "" && g.output == outTable {
		fmt.Fprintf(g.stderr, "more: add --cursor %s\n", cursor)
	}
}

func hostsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hosts",
		Short: "List compute hosts holding GPUs, with vGPU capacity and usage",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hl, err := g.api().Hosts(cmd.Context())
			if err != nil {
				return err
			}
			return g.emit(hl.Raw, func(w io.Writer) {
				// The mixed GPUs' column only where a host has one.
				mixed := slices.ContainsFunc(hl.Hosts, func(h apiclient.Host) bool { return h.MixedGPUCount > 0 })
				cols := []string{"NAME", "NODE", "GPUS", "CAPACITY", "USED", "FREE"}
				if mixed {
					cols = append(cols, "MIXED FB FREE")
				}
				header(w, cols...)
				for _, h := range hl.Hosts {
					cells := []string{h.Name, h.Node, itoa(h.GPUCount), itoa(h.Capacity), itoa(h.Used), itoa(h.Free)}
					if mixed {
						cells = append(cells, hostFB(h))
					}
					row(w, cells...)
				}
			})
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "show NAME",
		Short: "Show one host (compute service host or node name) and its GPUs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := g.api().Host(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.emit(h.Raw, func(w io.Writer) {
				pairs := []string{"Name", h.Name, "Node", h.Node, "Root provider", h.RootUUID,
					"GPUs", itoa(h.GPUCount), "vGPU capacity", itoa(h.Capacity), "Used", itoa(h.Used), "Free", itoa(h.Free)}
				if h.MixedGPUCount > 0 {
					pairs = append(pairs, "Mixed GPUs framebuffer", hostFB(h))
				}
				kv(w, append(pairs, "Traits", strings.Join(h.Traits, ","))...)
				fmt.Fprintln(w)
				gpuTable(w, h.GPUs, false)
			})
		},
	})
	return cmd
}

// hostFB is a host's MIXED FB FREE cell: the framebuffer its mixed
// bridge-owned GPUs have left of their total ("-" without any).
func hostFB(h apiclient.Host) string {
	if h.Framebuffer == nil || h.MixedGPUCount == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d MiB (%d GPU%s)", h.Framebuffer.FreeMiB, h.Framebuffer.TotalMiB, h.MixedGPUCount, map[bool]string{true: "", false: "s"}[h.MixedGPUCount == 1])
}

func gpuTable(w io.Writer, gs []apiclient.GPU, withHost bool) {
	cols := []string{"PCI ADDRESS", "PROFILE", "TRAIT", "CAPACITY", "USED", "FREE", "PROVIDER"}
	if withHost {
		cols = append([]string{"HOST"}, cols...)
	}
	header(w, cols...)
	for _, x := range gs {
		cells := []string{x.PCIAddress, x.Profile, x.Trait, itoa(x.Capacity), itoa(x.Used), itoa(x.Free), x.ProviderUUID}
		if x.Mode == apiclient.GPUModeMixed {
			// Framebuffer is the limit: MiB, and the vGPUs by type.
			cells = []string{x.PCIAddress, mixedProfile(x), "-", itoa(x.Capacity) + " MiB", itoa(x.Used) + " MiB", itoa(x.Free) + " MiB", x.ProviderUUID}
		}
		if withHost {
			cells = append([]string{x.Host}, cells...)
		}
		row(w, cells...)
	}
}

// mixedProfile is a mixed GPU's PROFILE cell: "mixed", then its vGPUs by
// type (profile, else type id, × count).
func mixedProfile(x apiclient.GPU) string {
	var in []string
	for _, u := range x.TypesInUse {
		in = append(in, cmp.Or(u.Profile, u.TypeID)+"×"+itoa(u.Count))
	}
	if len(in) == 0 {
		return "mixed"
	}
	return "mixed: " + strings.Join(in, ", ")
}

func gpusCmd(g *globals) *cobra.Command {
	var f apiclient.GPUFilter
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "List physical GPUs (Placement providers with vGPU inventory)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gl, err := g.api().GPUs(cmd.Context(), f)
			if err != nil {
				return err
			}
			return g.emit(gl.Raw, func(w io.Writer) { gpuTable(w, gl.GPUs, true) })
		},
	}
	cmd.Flags().StringVar(&f.Host, "host", "", "only this compute host or node")
	cmd.Flags().StringVar(&f.Profile, "profile", "", "only GPUs of this vGPU profile, e.g. T4-4Q")
	cmd.Flags().StringVar(&f.Trait, "trait", "", "only GPUs with this trait, e.g. CUSTOM_NVIDIA_232")
	return cmd
}

func instancesCmd(g *globals) *cobra.Command {
	var f apiclient.InstanceFilter
	var hasVGPU bool
	cmd := &cobra.Command{
		Use:   "instances",
		Short: "List instances known from Nova's notifications",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if flagChanged(cmd.Flags(), "has-vgpu") {
				f.HasVGPU = &hasVGPU
			}
			il, err := g.api().Instances(cmd.Context(), f)
			if err != nil {
				return err
			}
			if err := g.emit(il.Raw, func(w io.Writer) {
				header(w, "UUID", "NAME", "HOST", "PROJECT", "STATE", "VGPUS", "LAST EVENT", "AT")
				for _, in := range il.Instances {
					row(w, in.UUID, clip(str(in.DisplayName), 24), str(in.Host), str(in.ProjectID), vmState(in),
						itoa(in.VGPUs), str(in.LastEventType), tsp(in.LastEventAt))
				}
			}); err != nil {
				return err
			}
			g.more(il.NextCursor)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Host, "host", "", "only instances on this compute host")
	fl.StringVar(&f.Project, "project", "", "only instances of this project id")
	fl.BoolVar(&hasVGPU, "has-vgpu", false, "only instances whose flavor asks for vGPU (--has-vgpu=false: only those without)")
	fl.BoolVar(&f.Deleted, "deleted", false, "include deleted instances")
	fl.IntVar(&f.Limit, "limit", 0, "most instances in the page (1-1000; the bridge's default is 100)")
	fl.StringVar(&f.Cursor, "cursor", "", "next page: the cursor a previous page ended with")
	cmd.AddCommand(&cobra.Command{
		Use:   "show UUID",
		Short: "Show one instance",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, err := g.api().Instance(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.emit(in.Raw, func(w io.Writer) {
				kv(w, "UUID", in.UUID, "Name", str(in.DisplayName), "Project", str(in.ProjectID), "User", str(in.UserID),
					"Host", str(in.Host), "Node", str(in.Node), "Availability zone", str(in.AvailabilityZone),
					"VM state", str(in.VMState), "Task state", str(in.TaskState), "Power state", str(in.PowerState),
					"Flavor", flavorName(in.Flavor), "New flavor", flavorName(in.NewFlavor),
					"vGPUs", itoa(in.VGPUs), "vGPU demand", compact(in.VGPUDemand), "Fault", clip(compact(in.Fault), 200),
					"Last event", str(in.LastEventType), "Last event at", tsp(in.LastEventAt),
					"Created", ts(in.CreatedAt), "Updated", ts(in.UpdatedAt), "Deleted", tsp(in.DeletedAt))
			})
		},
	})
	return cmd
}

func vmState(in apiclient.Instance) string {
	s := str(in.VMState)
	if t := str(in.TaskState); t != "" {
		s += "/" + t
	}
	return s
}

// flavorName returns the flavor's name from its payload ("" when none).
func flavorName(raw json.RawMessage) string {
	var f struct {
		Name string `json:"name"`
		Data struct {
			Name string `json:"name"`
		} `json:"nova_object.data"`
	}
	if json.Unmarshal(raw, &f) != nil {
		return ""
	}
	if f.Name != "" {
		return f.Name
	}
	return f.Data.Name
}

func allocationsCmd(g *globals) *cobra.Command {
	var inst string
	cmd := &cobra.Command{
		Use:   "allocations",
		Short: "List vGPU allocations held on GPU providers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			al, err := g.api().Allocations(cmd.Context(), inst)
			if err != nil {
				return err
			}
			return g.emit(al.Raw, func(w io.Writer) {
				header(w, "INSTANCE", "HOST", "PCI ADDRESS", "PROFILE", "CLASS", "AMOUNT", "PROVIDER")
				for _, a := range al.Allocations {
					row(w, a.InstanceUUID, a.Host, a.PCIAddress, a.Profile, a.ResourceClass, itoa(a.Amount), a.ProviderUUID)
				}
			})
		},
	}
	cmd.Flags().StringVar(&inst, "instance", "", "only this instance (Placement consumer) UUID")
	return cmd
}

// parseSince reads an RFC 3339 time or a duration back from now (1h, 30m).
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, usageErr(fmt.Errorf("--since %q: give a duration back from now (90m, 24h) or an RFC 3339 time (2024-05-01T12:00:00Z)", s))
}

func eventsCmd(g *globals) *cobra.Command {
	var f apiclient.EventFilter
	var since string
	cmd := &cobra.Command{
		Use:   "events",
		Short: "List accepted events (Nova notifications, webhooks), oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			f.Since = t
			el, err := g.api().Events(cmd.Context(), f)
			if err != nil {
				return err
			}
			if err := g.emit(el.Raw, func(w io.Writer) {
				header(w, "ID", "OCCURRED", "TYPE", "INSTANCE", "SOURCE", "PUBLISHER", "STATUS")
				for _, e := range el.Events {
					status := str(e.Status)
					if status == "" {
						status = "accepted"
					}
					row(w, fmt.Sprint(e.ID), tsp(e.OccurredAt), e.EventType, str(e.InstanceUUID), e.Source, str(e.PublisherID), status)
				}
			}); err != nil {
				return err
			}
			g.more(el.NextCursor)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Instance, "instance", "", "only events of this instance UUID")
	fl.StringVar(&f.Type, "type", "", "only this event type; a trailing * matches a prefix (instance.resize*)")
	fl.StringVar(&since, "since", "", "only events that occurred since: a duration back from now (1h) or an RFC 3339 time")
	fl.BoolVar(&f.Payload, "payload", false, "include each event's payload (json and yaml output)")
	fl.IntVar(&f.Limit, "limit", 0, "most events in the page (1-1000; the bridge's default is 100)")
	fl.StringVar(&f.Cursor, "cursor", "", "next page: the cursor a previous page ended with")
	return cmd
}

func deadLettersCmd(g *globals) *cobra.Command {
	var f apiclient.DeadLetterFilter
	cmd := &cobra.Command{
		Use:   "dead-letters",
		Short: "List messages that could not be accepted, newest first (admin)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dl, err := g.api().DeadLetters(cmd.Context(), f)
			if err != nil {
				return err
			}
			if err := g.emit(dl.Raw, func(w io.Writer) {
				header(w, "ID", "RECEIVED", "SOURCE", "REASON", "MESSAGE ID", "DETAIL")
				for _, d := range dl.DeadLetters {
					row(w, fmt.Sprint(d.ID), ts(d.ReceivedAt), d.Source, d.Reason, str(d.MessageID), clip(str(d.Detail), 60))
				}
			}); err != nil {
				return err
			}
			g.more(dl.NextCursor)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Reason, "reason", "", "only this reason: not_json, broken_envelope, oversize, no_message_id, schema")
	fl.StringVar(&f.Source, "source", "", "only this source, e.g. nova")
	fl.IntVar(&f.Limit, "limit", 0, "most dead letters in the page (1-1000; the bridge's default is 100)")
	fl.StringVar(&f.Cursor, "cursor", "", "next page: the cursor a previous page ended with")
	cmd.RegisterFlagCompletionFunc("reason", cobra.FixedCompletions([]string{"not_json", "broken_envelope", "oversize", "no_message_id", "schema"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
