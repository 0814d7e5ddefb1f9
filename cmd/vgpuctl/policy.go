package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
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
	cmd.AddCommand(explain)
	return cmd
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
