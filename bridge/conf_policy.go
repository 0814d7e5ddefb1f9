package bridge

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/policyapi"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

var (
	optPolicyRulesFile = policyOptions.String("policy", "rules_file", defaultRulesFile,
		"The policy: workload -> vGPU profile preferences, project quotas and attach modes, and CEL rules that turn "+
			"events into intents (see etc/vgpu-bridge/rules.yaml). Checked at start (a broken file stops the bridge) "+
			"and reloaded on SIGHUP and when it changes (a broken new file is refused, the active policy stays); a SIGHUP "+
			"after this option changed reads the new path. "+
			"Validate with `vgpu-bridge policy check FILE`. Until 0.1 the default was /etc/vgpu-bridge/policy.yaml "+
			"(a name oslo.policy uses for API access rules): when this default is absent and that file exists, it is "+
			"read, with a deprecation warning. Example: /etc/vgpu-bridge/rules.yaml")
	optPolicyProfilesFile = policyOptions.String("policy", "profiles_file", "/etc/vgpu-bridge/profiles.yaml",
		"Seed of the vGPU profile catalog: type id (nvidia-232) -> profile name (T4-4Q), instances per GPU. Agents' "+
			"reports override it; empty starts with an empty catalog. Example: /etc/vgpu-bridge/profiles.yaml")
	optPolicyCompatFile = policyOptions.String("policy", "driver_compat_file", "/etc/vgpu-bridge/driver-compat.yaml",
		"NVIDIA host/guest driver compatibility (branch rule, exceptions, known-good rows). Hosts that cannot serve an "+
			"instance's declared guest driver are excluded; empty disables the check. "+
			"Example: /etc/vgpu-bridge/driver-compat.yaml")
	optPolicyReloadInterval = policyOptions.Duration("policy", "reload_interval", 10*time.Second, 0, time.Hour,
		"How often the rules file's modification time and content hash are checked for a reload; 0 disables "+
			"polling (SIGHUP still reloads). Example: 30s")
)

// policyOptions are the options declared in this file; Options assembles them
// into the daemon's set with validatePolicy.
var policyOptions = conf.NewGroup().
	SectionHelp("policy", "The policy engine: which workloads get which vGPU profile, load rules with "+
		"hysteresis and cooldown, per-project quotas, attach mode and driver compatibility.")

// validatePolicy tests relations between the options of this file.
func validatePolicy(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if optPolicyRulesFile.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "policy", Option: "rules_file",
			Problem: "must name a policy file; allowed: a path such as /etc/vgpu-bridge/rules.yaml"})
	}
	return errs
}

// The rules file's default, and the one it had before it was renamed so
// as not to look like oslo.policy's policy.yaml.
const (
	defaultRulesFile    = "/etc/vgpu-bridge/rules.yaml"
	deprecatedRulesFile = "/etc/vgpu-bridge/policy.yaml"
)

// RulesFile is [policy] rules_file, or the deprecated default file when
// the option is left at its default, that file is absent and the old one
// exists (deprecated is then true).
func RulesFile(v *conf.Values) (path string, deprecated bool) {
	return rulesFile(optPolicyRulesFile.Get(v), defaultRulesFile, deprecatedRulesFile)
}

func rulesFile(set, def, old string) (string, bool) {
	if set != def {
		return set, false
	}
	if _, err := os.Stat(def); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return def, false
	}
	if _, err := os.Stat(old); err == nil {
		return old, true
	}
	return def, false
}

// PolicyConfig maps [policy] to policy.Config.
func PolicyConfig(v *conf.Values) policy.Config {
	rules, _ := RulesFile(v)
	return policy.Config{
		RulesFile:    rules,
		ProfilesFile: optPolicyProfilesFile.Get(v),
		CompatFile:   optPolicyCompatFile.Get(v),
		Interval:     optPolicyReloadInterval.Get(v),
	}
}

// setupPolicy loads the policy (a broken file stops the bridge: the error
// names every problem with its line and column), registers
// POST /v1/policy/explain and the policy metrics, and returns the holder
// and its reload loop: SIGHUP and, every [policy] reload_interval, a
// change of the file. A broken new file is refused, logged and counted;
// the active policy stays and /readyz is not affected. cat is the shared
// profile catalog (nil: one seeded from [policy] profiles_file); state, if
// not nil, gives the explain API the live state. bridge.Run calls it at the
// features mark, before placement so that both share one catalog:
//
//	pol, polComp, err := setupPolicy(w, nil, nil, nil)
//	if err != nil { return err }
//	comps = append(comps, polComp)
//	cat := pol.Catalog() // for setupPlacement; agents' reports go to cat.Observe
//
// The pipeline's decide stage calls pol.Policy().Evaluate(event, state,
// tracker) and, once it acts on the decision, tracker.Apply(d.LoadUpdates).
func setupPolicy(w *wiring, cat *catalog.Catalog, state func() policy.State, load policy.LoadState) (*policy.Holder, component, error) {
	v, srv, log := w.v, w.srv, w.log.With("component", "policy")
	cfg := PolicyConfig(v)
	if _, deprecated := RulesFile(v); deprecated {
		log.Warn("DEPRECATED: the policy rules are read from "+deprecatedRulesFile+"; rename it to "+defaultRulesFile+
			" (or set [policy] rules_file): the old default will be dropped", "file", cfg.RulesFile)
	}
	h, err := policy.NewHolder(cfg, cat)
	if err != nil {
		return nil, component{}, err
	}
	if w.rl != nil {
		w.rl.setPolicy(h) // SIGHUP: a new [policy] rules_file (reload.go)
	}
	reg := srv.Registry()
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpu_bridge_policy_reloads_total",
			Help: "Policy loads that succeeded (the first load included)."},
			func() float64 { r, _, _ := h.Stats(); return float64(r) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpu_bridge_policy_reload_failures_total",
			Help: "Policy reloads refused because the new file was broken; the previous policy stayed active."},
			func() float64 { _, f, _ := h.Stats(); return float64(f) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpu_bridge_policy_rules",
			Help: "Rules in the active policy."},
			func() float64 { return float64(len(h.Policy().Rules())) }),
	)
	policyapi.New(policyapi.Config{Holder: h, State: state, Load: load, Pool: w.pool,
		ClockSkew: PipelineConfig(v, w.replica).ClockSkewTolerance, Log: log}).Register(srv)
	log.Info("policy loaded", "file", cfg.RulesFile, "rules", len(h.Policy().Rules()), "policy", h.Policy().Hash())
	run := func(ctx context.Context) error {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		if cfg.Interval > 0 {
			go h.Watch(ctx, cfg.Interval, log)
		}
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-hup:
				if err := h.Reload(); err != nil {
					log.Error("policy reload refused on SIGHUP; keeping the active policy", "err", err.Error())
				} else {
					log.Info("policy reloaded on SIGHUP", "file", h.RulesFile(), "policy", h.Policy().Hash())
				}
			}
		}
	}
	return h, component{name: "policy", run: run}, nil
}
