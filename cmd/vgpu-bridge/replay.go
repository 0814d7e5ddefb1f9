package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/policyreplay"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// replayWriter is the output of a replay: table or JSON.
type replayWriter interface {
	Event(policyreplay.Event) error
	Close(policyreplay.Summary, error) error
}

func newPolicyReplayCmd(g *globals) *cobra.Command {
	var files policyFiles
	var candidate, since, until, output string
	var maxEvents int
	var onlyDiffering bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "replay --since T --until T --rules CANDIDATE.yaml",
		Short: "Run the recorded events of a window through the rules in force and a candidate rules file, with no side effect",
		Long: `Read the events the bridge received and processed between --since and --until
(its inbox, table events) and evaluate each with the rules in force
(--policy, default [policy] rules_file) and with the candidate rules file
(--rules), compiled against the same profile catalog and driver
compatibility files. Print, per event, the intents of both side by side and
the intent kinds that differ, then a summary: how many attaches, releases,
resizes, moves, tunes, set_limits, notifies and rejections would differ, the events
evaluated, and those that could not be, with the reason.

Nothing is written: the events and the state are read in one read-only
transaction, and only the policies are evaluated (no claim, no command, no
request, no audit row, no load-rule state). The state an event is judged on
(its instance and vGPUs, the hosts' reports, the project's usage) is the
bridge's now; load rules' for: windows and cooldowns start empty at --since
and run over the replayed events, one memory per rules file.

--since and --until are RFC 3339 times or durations before now ("24h");
--until defaults to now. At most --max-events events are evaluated, read a
few hundred at a time; the summary says when the window held more.
A candidate that does not compile is refused before anything is read, one
problem a line (FILE:LINE:COL: rule "NAME": message), exit status 2.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if candidate == "" {
				return usageError{Err: errors.New("--rules CANDIDATE.yaml is required")}
			}
			if output != "table" && output != "json" {
				return usageError{Err: fmt.Errorf("-o %q: want table or json", output)}
			}
			now := time.Now()
			from, err := parseWhen(since, now)
			if err != nil {
				return usageError{Err: fmt.Errorf("--since: %w", err)}
			}
			to := now
			if until != "" {
				if to, err = parseWhen(until, now); err != nil {
					return usageError{Err: fmt.Errorf("--until: %w", err)}
				}
			}
			cfg := files.resolve(g)
			if cfg.RulesFile == "" {
				return usageError{Err: errors.New("no rules in force: give --policy or set [policy] rules_file")}
			}
			active, err := policy.Build(cfg, nil)
			if err != nil {
				return usageError{Err: fmt.Errorf("rules in force: %w", err)}
			}
			cand, err := policy.LoadFile(candidate, policy.Options{Catalog: active.Catalog(), Compat: active.Compat()})
			if err != nil {
				return usageError{Err: fmt.Errorf("candidate rules refused:\n%w", err)}
			}
			o := policyreplay.Options{Since: from, Until: to, MaxEvents: maxEvents, Active: active, Candidate: cand,
				Catalog: active.Catalog()}
			if err := o.Validate(); err != nil {
				return usageError{Err: err}
			}
			v, err := g.Load()
			if err != nil {
				return err
			}
			o.ClockSkew = bridge.PipelineConfig(v, "").ClockSkewTolerance
			o.Log = g.Logger(v)
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			pool, err := openStore(ctx, v)
			if err != nil {
				return err
			}
			defer pool.Close()
			var w replayWriter
			if output == "json" {
				w = policyreplay.NewJSONWriter(g.Stdout)
			} else {
				tw := policyreplay.NewTableWriter(g.Stdout)
				tw.OnlyDiffering = onlyDiffering
				w = tw
			}
			sum, err := policyreplay.Run(ctx, pool, o, w.Event)
			if werr := w.Close(sum, err); werr != nil && err == nil {
				err = werr
			}
			return err
		},
	}
	c.Flags().StringVar(&candidate, "rules", "", "candidate rules file (required)")
	c.Flags().StringVar(&files.rules, "policy", "", "rules in force (default: [policy] rules_file)")
	c.Flags().StringVar(&files.profiles, "profiles", "", "profile catalog seed (default: [policy] profiles_file, or profiles.yaml next to the policy)")
	c.Flags().StringVar(&files.compat, "compat", "", "driver compatibility file (default: [policy] driver_compat_file, or driver-compat.yaml next to the policy)")
	c.Flags().StringVar(&since, "since", "", "start of the window: RFC 3339, or a duration before now (24h) (required)")
	c.Flags().StringVar(&until, "until", "", "end of the window, excluded: RFC 3339, or a duration before now (default now)")
	c.Flags().IntVar(&maxEvents, "max-events", policyreplay.DefaultMaxEvents, fmt.Sprintf("evaluate at most this many events (1 to %d)", policyreplay.MaxEvents))
	c.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	c.Flags().BoolVar(&onlyDiffering, "only-differing", false, "table: show only the events the two decide differently (the summary counts all)")
	c.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	return c
}

// parseWhen reads an RFC 3339 time, or a duration before now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, errors.New("is required")
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2026-12-06T00:00:00Z) or a duration before now (24h)", s)
	}
	return now.Add(-d), nil
}
