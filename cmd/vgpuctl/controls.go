package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

// controlsCmds are the operator controls: pause, resume, observe-only,
// drain, undrain.
func controlsCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{pauseCmd(g, true), pauseCmd(g, false), observeOnlyCmd(g), drainCmd(g, true), drainCmd(g, false), controlsCmd(g)}
}

func printControls(g *globals, c apiclient.Controls) error {
	return g.emit(c.Raw, func(w io.Writer) {
		kv(w, "Paused", yesNo(c.Paused), "Observe-only", yesNo(c.ObserveOnly), "Reason", c.Reason, "By", c.Actor,
			"Request ID", c.RequestID, "Paused at", tsp(c.PausedAt), "Observe since", tsp(c.ObserveSince), "Updated", ts(c.UpdatedAt))
	})
}

func controlsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "controls",
		Short: "Show the global switches: paused, observe-only",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.api().Controls(cmd.Context())
			if err != nil {
				return err
			}
			return printControls(g, c)
		},
	}
}

func pauseCmd(g *globals, pause bool) *cobra.Command {
	var reason string
	use, short := "pause", "Pause the bridge: no new decisions, nothing sent to agents (admin, audited)"
	long := `Pause every bridge replica: the pipeline takes no new decisions and the
outbox sends nothing until 'vgpuctl resume'. Notifications and webhooks are
still accepted and wait in the inbox; nothing is lost. The command returns
once no decision made before the pause is still in flight.`
	if !pause {
		use, short, long = "resume", "Resume a paused bridge (admin, audited)", "Resume a paused bridge: the inbox's waiting events are decided in order."
	}
	cmd := &cobra.Command{
		Use:   use + " --reason TEXT",
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.api().SetControls(cmd.Context(), apiclient.ControlsChange{Paused: &pause, Reason: reason})
			if err != nil {
				return err
			}
			return printControls(g, c)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required, audited), e.g. \"maintenance window CHG-1234\"")
	cmd.MarkFlagRequired("reason")
	return cmd
}

func observeOnlyCmd(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "observe-only on|off --reason TEXT",
		Short: "Decide and explain, act on nothing (admin, audited)",
		Long: `With observe-only on, the pipeline decides as usual and records its
decisions, but acts on nothing: a request that would act ends rejected with
code observe_only and a reason saying what would have been done, and the
outbox sends nothing to agents.`,
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			on := args[0] == "on"
			c, err := g.api().SetControls(cmd.Context(), apiclient.ControlsChange{ObserveOnly: &on, Reason: reason})
			if err != nil {
				return err
			}
			return printControls(g, c)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required, audited)")
	cmd.MarkFlagRequired("reason")
	return cmd
}

func drainCmd(g *globals, drain bool) *cobra.Command {
	var reason string
	use, short := "drain", "Drain a host or a GPU: no new placements there (admin, audited)"
	if !drain {
		use, short = "undrain", "Undrain a host or a GPU (admin, audited)"
	}
	cmd := &cobra.Command{
		Use:   use + " host NAME | gpu PROVIDER_UUID",
		Short: short,
		Long: short + `.

A host is named by its compute service host or node name; a GPU by its
resource provider UUID (vgpuctl gpus). vGPUs already there stay untouched.`,
		Args:      cobra.ExactArgs(2),
		ValidArgs: []string{"host", "gpu"},
		RunE: func(cmd *cobra.Command, args []string) error {
			var kind apiclient.DrainKind
			switch args[0] {
			case "host":
				kind = apiclient.DrainHost
			case "gpu":
				kind = apiclient.DrainGPU
			default:
				return usageErr(fmt.Errorf("drain what: %q is not host or gpu", args[0]))
			}
			if drain && strings.TrimSpace(reason) == "" {
				return usageErr(errors.New("--reason is required to drain"))
			}
			d, err := g.api().SetDrain(cmd.Context(), kind, args[1], reason, drain)
			if err != nil {
				return err
			}
			return g.emit(d.Raw, func(w io.Writer) {
				name := d.Name
				if kind == apiclient.DrainGPU {
					name = d.ProviderUUID
				}
				kv(w, strings.ToUpper(args[0][:1])+args[0][1:], name, "Node", d.Node, "Drained", yesNo(d.Drained), "Reason", d.DrainReason,
					"By", d.DrainedBy, "Since", tsp(d.DrainedAt), "Changed", yesNo(d.Changed))
				if kind == apiclient.DrainHost {
					kv(w, "Nova disabled", yesNo(d.Disabled), "Disabled reason", d.DisabledReason)
				}
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required to drain, audited)")
	return cmd
}

// deadLetterReplayCmd is `vgpuctl dead-letters replay ID`.
func deadLetterReplayCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "replay ID",
		Short: "Run a dead letter's stored body through ingest again (admin, audited)",
		Long: `Run a dead letter's stored body through the same decoding and validation as
a delivery, with the bridge's configuration of today (e.g. after raising
[notifications] max_message_bytes). Deduplicated on message_id: a message
already in the inbox answers "duplicate". A body still refused, one capped
when it was kept, or one of another source than Nova notifications is
refused (exit 1).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id < 1 {
				return usageErr(fmt.Errorf("dead letter id %q: a positive integer (vgpuctl dead-letters)", args[0]))
			}
			r, err := g.api().ReplayDeadLetter(cmd.Context(), id)
			if err != nil {
				return err
			}
			return g.emit(r.Raw, func(w io.Writer) {
				kv(w, "Dead letter", strconv.FormatInt(r.DeadLetterID, 10), "Outcome", r.Outcome, "Event", strconv.FormatInt(r.EventID, 10),
					"Message ID", r.MessageID, "Event type", r.EventType)
			})
		},
	}
}
