package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// policyFiles resolves the three policy files: flags first, then the
// configuration, then files next to the rules file.
type policyFiles struct {
	rules, profiles, compat string
}

func (f *policyFiles) resolve(g *globals) policy.Config {
	cfg := policy.Config{RulesFile: f.rules, ProfilesFile: f.profiles, CompatFile: f.compat}
	var fromConf *policy.Config
	if v, err := g.Load(); err == nil {
		c := bridge.PolicyConfig(v)
		fromConf = &c
	}
	if cfg.RulesFile == "" && fromConf != nil {
		cfg.RulesFile = fromConf.RulesFile
	}
	sibling := func(name string) string {
		p := filepath.Join(filepath.Dir(cfg.RulesFile), name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		return ""
	}
	if cfg.ProfilesFile == "" {
		if fromConf != nil && f.rules == "" {
			cfg.ProfilesFile = fromConf.ProfilesFile
		} else {
			cfg.ProfilesFile = sibling("profiles.yaml")
		}
	}
	if cfg.CompatFile == "" {
		if fromConf != nil && f.rules == "" {
			cfg.CompatFile = fromConf.CompatFile
		} else {
			cfg.CompatFile = sibling("driver-compat.yaml")
		}
	}
	return cfg
}

func newPolicyCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "policy",
		Short: "Check the policy files and explain decisions ([policy] rules_file)",
	}
	var files policyFiles
	check := &cobra.Command{
		Use:   "check [FILE]",
		Short: "Validate a policy file with its profiles and driver-compat files; exit 2 with FILE:LINE:COL for each problem",
		Long: `Validate a policy file (default: [policy] rules_file) together with the profile
catalog and driver compatibility files it is compiled against (flags, else
the configuration, else profiles.yaml and driver-compat.yaml next to FILE).
Every problem is printed as FILE:LINE:COL: message, CEL type errors with the
rule's name; the exit status is 2 when there is any.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				files.rules = args[0]
			}
			cfg := files.resolve(g)
			if cfg.RulesFile == "" {
				return usageError{Err: errors.New("no policy file: give FILE or set [policy] rules_file")}
			}
			n := 0
			report := func(err error) {
				var le *policy.LoadError
				var ce *catalog.LoadError
				switch {
				case errors.As(err, &le):
					fmt.Fprintln(g.Stdout, le.Error())
					n += len(le.Errors)
				case errors.As(err, &ce):
					fmt.Fprintln(g.Stdout, ce.Error())
					n += len(ce.Errors)
				default:
					fmt.Fprintln(g.Stdout, err)
					n++
				}
			}
			cat := catalog.New()
			if cfg.ProfilesFile != "" {
				seed, err := catalog.LoadFile(cfg.ProfilesFile)
				if err != nil {
					report(err)
				} else {
					cat.Merge(seed)
				}
			}
			var compat *policy.Compat
			if cfg.CompatFile != "" {
				c, err := policy.LoadCompatFile(cfg.CompatFile)
				if err != nil {
					report(err)
				}
				compat = c
			}
			p, err := policy.LoadFile(cfg.RulesFile, policy.Options{Catalog: cat, Compat: compat})
			if err != nil {
				report(err)
			}
			if n > 0 {
				return usageError{Err: fmt.Errorf("%d problem(s) in the policy files", n)}
			}
			fmt.Fprintf(g.Stdout, "%s: OK: %d rule(s), %d profile(s) (%s), driver compatibility %s, policy %s\n",
				cfg.RulesFile, len(p.Rules()), cat.Len(), orDash(cfg.ProfilesFile), orDash(cfg.CompatFile), p.Hash())
			return nil
		},
	}
	for _, cmd := range []*cobra.Command{check} {
		cmd.Flags().StringVar(&files.profiles, "profiles", "", "profile catalog seed (default: [policy] profiles_file, or profiles.yaml next to FILE)")
		cmd.Flags().StringVar(&files.compat, "compat", "", "driver compatibility file (default: [policy] driver_compat_file, or driver-compat.yaml next to FILE)")
	}

	var eventFile, output, at string
	explain := &cobra.Command{
		Use:   "explain --event FILE",
		Short: "Print the decision the policy takes for an event (and optional state) in a JSON file",
		Long: `Evaluate one event against the policy and print the decision: the intents,
which rule fired with which values, and why the other rules did not.

FILE is JSON: either an event ({"kind": "webhook.GPU_REQUEST", "instance_uuid": ...,
"workload": "training"}) or {"event": {...}, "state": {"instances": [...],
"hosts": [...], "usage": {"PROJECT": {"vgpus": 1, "framebuffer_mib": 4096}}}}.
Load rules see no history here: a rule with "for" reports that it starts holding.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if eventFile == "" {
				return usageError{Err: errors.New("--event FILE is required")}
			}
			if output != "text" && output != "json" {
				return usageError{Err: fmt.Errorf("-o %q: want text or json", output)}
			}
			cfg := files.resolve(g)
			if cfg.RulesFile == "" {
				return usageError{Err: errors.New("no policy file: give --policy or set [policy] rules_file")}
			}
			if at != "" {
				t, err := time.Parse(time.RFC3339, at)
				if err != nil {
					return usageError{Err: fmt.Errorf("--at: %w", err)}
				}
				cfg.Clock = func() time.Time { return t }
			}
			p, err := policy.Build(cfg, nil)
			if err != nil {
				return usageError{Err: err}
			}
			f, err := os.Open(eventFile)
			if err != nil {
				return err
			}
			defer f.Close()
			in, err := policy.ReadExplainInput(f)
			if err != nil {
				return usageError{Err: fmt.Errorf("%s: %w", eventFile, err)}
			}
			var st policy.State
			if in.State != nil {
				st = in.State
			}
			d := p.Evaluate(in.Event, st, nil)
			if output == "json" {
				enc := json.NewEncoder(g.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(d)
			}
			fmt.Fprint(g.Stdout, d.Explain())
			return nil
		},
	}
	explain.Flags().StringVar(&eventFile, "event", "", "JSON file with the event (and optionally the state)")
	explain.Flags().StringVar(&files.rules, "policy", "", "policy file (default: [policy] rules_file)")
	explain.Flags().StringVar(&files.profiles, "profiles", "", "profile catalog seed (default: [policy] profiles_file, or profiles.yaml next to the policy)")
	explain.Flags().StringVar(&files.compat, "compat", "", "driver compatibility file (default: [policy] driver_compat_file, or driver-compat.yaml next to the policy)")
	explain.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	explain.Flags().StringVar(&at, "at", "", "time of an event without one (RFC 3339); default now")
	c.AddCommand(check, explain, newPolicyReplayCmd(g))
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
