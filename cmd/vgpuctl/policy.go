package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

func policyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Ask the bridge's active policy",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var eventFile, stateFile string
	explain := &cobra.Command{
		Use:   "explain --event FILE",
		Short: "Explain what the active policy decides for an event, and why",
		Long: `Explain what the active policy decides for an event: the intents, the rule
that fired with its values, and why the other rules did not. Nothing is
executed and load-rule history is not changed.

FILE ("-" for standard input) holds the event, e.g.
  {"kind": "webhook.GPU_REQUEST", "instance_uuid": "…", "workload": "training"}
or a whole request body {"event": {…}, "state": {…}}. Without a state the
bridge judges the event against its live state; --state FILE gives one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			body, err := explainBody(eventFile, stateFile)
			if err != nil {
				return err
			}
			out, err := g.api().Explain(cmd.Context(), body)
			if err != nil {
				return err
			}
			return g.emit(out.Raw, func(w io.Writer) {
				fmt.Fprint(w, out.Text)
				if !strings.HasSuffix(out.Text, "\n") {
					fmt.Fprintln(w)
				}
			})
		},
	}
	explain.Flags().StringVar(&eventFile, "event", "", `file holding the event as JSON ("-": standard input); required`)
	explain.Flags().StringVar(&stateFile, "state", "", "file holding a state to judge the event against, instead of the live one")
	explain.MarkFlagRequired("event")
	explain.MarkFlagFilename("event", "json")
	explain.MarkFlagFilename("state", "json")
	cmd.AddCommand(explain, policyReplayCmd(g))
	return cmd
}

func policyReplayCmd(g *globals) *cobra.Command {
	var rulesFile, since, until string
	var maxEvents int
	c := &cobra.Command{
		Use:   "replay --rules FILE --since T [--until T]",
		Short: "Run the recorded events of a window through the active policy and a candidate rules file (admin; no side effect)",
		Long: `Ask the bridge to run the events it recorded between --since and --until through
its active policy and through the candidate rules FILE ("-": standard input),
and show, per event, the intents of both and the intent kinds that differ,
then how many attaches, releases, resizes, moves, tunes, set_limits, notifies and
rejections would differ. Nothing is claimed, commanded or recorded.

--since and --until are RFC 3339 times or durations before now ("24h");
--until defaults to now. The bridge evaluates at most --max-events (0: its
default, 1000; at most 10000). POST /v1/policy/replay; rule vgpu:policy:replay.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rules, err := readInput(rulesFile)
			if err != nil {
				return usageErr(fmt.Errorf("--rules: %w", err))
			}
			now := time.Now()
			req := apiclient.PolicyReplayRequest{Rules: string(rules), MaxEvents: maxEvents}
			if req.Since, err = when(since, now); err != nil {
				return usageErr(fmt.Errorf("--since: %w", err))
			}
			req.Until = now
			if until != "" {
				if req.Until, err = when(until, now); err != nil {
					return usageErr(fmt.Errorf("--until: %w", err))
				}
			}
			out, err := g.api().ReplayPolicy(cmd.Context(), req)
			if err != nil {
				return err
			}
			return g.emit(out.Raw, func(w io.Writer) {
				header(w, "EVENT", "TIME", "KIND", "INSTANCE", "IN FORCE", "CANDIDATE", "DIFFERS")
				for _, ev := range out.Events {
					if ev.Error != "" {
						row(w, strconv.FormatInt(ev.ID, 10), ev.Time.UTC().Format(time.RFC3339), ev.Kind, ev.Instance, "error", "error", clip(ev.Error, 160))
						continue
					}
					row(w, strconv.FormatInt(ev.ID, 10), ev.Time.UTC().Format(time.RFC3339), ev.Kind, ev.Instance,
						replaySide(ev.Active), replaySide(ev.Candidate), strings.Join(ev.Differs, ","))
				}
				s := out.Summary
				fmt.Fprintf(w, "\nevents: %d read, %d evaluated, %d failed, %d differ\n", s.Events, s.Evaluated, s.Failed, s.Differing)
				var d []string
				for _, k := range []string{"attach", "release", "resize", "move", "tune", "set_limits", "notify", "reject"} {
					d = append(d, fmt.Sprintf("%s %d", k, s.Differ[k]))
				}
				fmt.Fprintf(w, "would differ: %s\n", strings.Join(d, ", "))
				if s.Truncated {
					fmt.Fprintf(w, "truncated: the window holds more than %d events\n", s.MaxEvents)
				}
				if out.Error != "" {
					fmt.Fprintf(w, "replay ended early: %s\n", out.Error)
				}
			})
		},
	}
	c.Flags().StringVar(&rulesFile, "rules", "", `candidate rules file ("-": standard input); required`)
	c.Flags().StringVar(&since, "since", "", "start of the window: RFC 3339, or a duration before now (24h); required")
	c.Flags().StringVar(&until, "until", "", "end of the window, excluded (default now)")
	c.Flags().IntVar(&maxEvents, "max-events", 0, "evaluate at most this many events (0: the bridge's default)")
	c.MarkFlagRequired("rules")
	c.MarkFlagRequired("since")
	c.MarkFlagFilename("rules", "yaml", "yml")
	return c
}

// replaySide renders one policy's decision of a replayed event.
func replaySide(s apiclient.PolicyReplaySide) string {
	var parts []string
	for _, in := range s.Intents {
		p := in.Kind
		if in.Profile != "" {
			p += "(" + in.Profile + ")"
		}
		parts = append(parts, p)
	}
	if s.Rejected {
		parts = append(parts, "rejected("+clip(s.Reason, 60)+")")
	}
	if len(s.RuleErrors) > 0 {
		parts = append(parts, fmt.Sprintf("%d rule error(s)", len(s.RuleErrors)))
	}
	return strings.Join(parts, " ")
}

// when reads an RFC 3339 time, or a duration before now.
func when(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time or a duration before now (24h)", s)
	}
	return now.Add(-d), nil
}

func readInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
	}
	return os.ReadFile(name)
}

// explainBody builds {"event": …, "state": …} from the files.
func explainBody(eventFile, stateFile string) (json.RawMessage, error) {
	b, err := readInput(eventFile)
	if err != nil {
		return nil, usageErr(fmt.Errorf("--event: %w", err))
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, usageErr(fmt.Errorf("--event %s: not a JSON object: %w", eventFile, err))
	}
	body := top
	if _, whole := top["event"]; !whole {
		body = map[string]json.RawMessage{"event": json.RawMessage(bytes.TrimSpace(b))}
	}
	if stateFile != "" {
		s, err := readInput(stateFile)
		if err != nil {
			return nil, usageErr(fmt.Errorf("--state: %w", err))
		}
		if !json.Valid(s) {
			return nil, usageErr(fmt.Errorf("--state %s: not JSON", stateFile))
		}
		body["state"] = json.RawMessage(bytes.TrimSpace(s))
	}
	return json.Marshal(body)
}
