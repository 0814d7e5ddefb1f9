package placement

import (
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// options are the [placement] options this package's code reads, declared
// once with their defaults: the bridge's set takes them from Options, and
// DefaultConfig (the defaults a zero Config field takes) is built from
// them. How Placement is reached without Keystone's catalog
// (endpoint_override, token_file) is the bridge's.
var options = conf.NewGroup()

var (
	optMicroversion = options.String("placement", "microversion", DefaultMicroversion,
		"Placement microversion of every request (OpenStack-API-Version: placement X); 1.38 or later for consumer types. Example: 1.39")
	optTimeout = options.Duration("placement", "timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long one Placement request may take. Example: 30s")
	optClasses = options.List("placement", "vgpu_resource_classes", "VGPU",
		"Resource classes whose inventory makes a provider a physical GPU, first match wins. "+
			"Example: VGPU,CUSTOM_VGPU_A16")
	optTypePrefix = options.String("placement", "type_trait_prefix", engine.DefaultTypePrefix,
		"Prefix of the traits that name a GPU's vGPU type (CUSTOM_ + upper-cased type id, as Nova names them). Example: CUSTOM_NVIDIA_")
	optAddTypeTraits = options.Bool("placement", "add_type_traits", false,
		"Opt-in: add to each GPU provider that has no type_trait_prefix trait the type its host's agent reports "+
			"(creating the CUSTOM_ trait when missing), so that Nova's scheduler and vGPU flavors see it. The bridge "+
			"never removes a trait and never changes an inventory; each trait added is audited. Needs a Placement "+
			"account allowed to write traits. Example: true")
	optAddDriverTraits = options.Bool("placement", "add_driver_traits", false,
		"Opt-in: keep on each GPU provider, and on its host's compute node provider, the traits "+
			"CUSTOM_VGPU_GUEST_DRIVER_R<branch> of the guest driver release branches the host's vGPU manager serves (the "+
			"version its agent reports, judged by [policy] driver_compat_file), adding and removing only traits of that "+
			"prefix, so that a flavor or image asking for trait:CUSTOM_VGPU_GUEST_DRIVER_R535=required never lands where "+
			"the guest would show code 43 (vgpuctl flavor plan --driver-branch 535 plans such flavors; an image's trait, "+
			"in Nova's unnumbered request group, is met by the compute node). Each change "+
			"is audited. Needs a Placement account allowed to write traits. Example: true")
	optOwnedGPUs = options.List("placement", "bridge_owned_gpus", "",
		"GPUs that Nova does not manage and the bridge owns, as HOST/PCI=TYPE: Nova's compute service host, the GPU's "+
			"PCI address and the vGPU type it offers. A numeric TYPE declares a vendor-VFIO GPU (SR-IOV, vGPU 17+; PCI is "+
			"its physical function) whose VFs the bridge types; an mdev TYPE (nvidia-231) declares an mdev GPU (one its "+
			"agent reports with mdev types and no VFs) on which the bridge's agent creates mdevs of the type. For each, the "+
			"bridge creates a child provider of the compute node's provider with an inventory of CUSTOM_VGPU_BRIDGE "+
			"(the vGPUs of the type the GPU holds or can still create) and the type's trait, which only its direct path "+
			"claims: Nova's resources:VGPU flavors never match it. HOST/PF=mixed declares a vendor-VFIO GPU in the "+
			"driver's heterogeneous (mixed-size) vGPU mode instead: its provider offers the GPU's framebuffer in MiB of "+
			"CUSTOM_VGPU_BRIDGE_FB_MIB and every reported type's trait, and each vGPU claims its type's framebuffer. "+
			"A GPU (not mixed) taken out of the list loses that provider once no vGPU is allocated on it (until "+
			"then it is kept, its inventory reserved whole). Never list a GPU that is in Nova's [pci] device_spec or "+
			"[devices] enabled_mdev_types (or [mdev_<type>] device_addresses). Formerly bridge_owned_vf_gpus (deprecated "+
			"name, still read). Example: compute-7/0000:c1:00.0=1430,compute-7/0000:d8:00.0=nvidia-231")
	optRetypeOnDemand = options.Bool("placement", "retype_on_demand", false,
		"Opt-in: when a direct-path request needs a vGPU type that no free capacity of the instance's host offers, "+
			"re-type an empty GPU of bridge_owned_gpus on that host (no VF typed by the bridge or mdev of the bridge on "+
			"it, no unit allocated on its provider) whose agent reports the type creatable, as `vgpuctl gpu retype` "+
			"does, then claim there. The GPUs of the host are tried in PCI address order; each re-type is audited "+
			"(gpu.retype, with the request). Off, such a request fails no_capacity and its reason names the GPU an "+
			"operator can re-type. Example: true")
	optNovaVFClasses = options.List("placement", "nova_vf_resource_classes", "",
		"Nova-owned VF GPUs: the resource classes of Nova's PCI providers (the resource_class of [pci] device_spec "+
			"entries, with [pci] report_in_placement) whose VFs are vGPUs, each with the numeric vGPU type its VFs "+
			"are typed for, as CLASS=TYPE. The bridge mirrors those providers (one per physical function, made by "+
			"Nova's resource tracker) as GPUs of that type for the GPU list, dry runs and flavor choice; its direct path "+
			"never claims on them, and it never writes them. `vgpuctl host layout` prints the matching device_spec. "+
			"Example: CUSTOM_VGPU_VF_1430=1430")
	optNovaVFAliases = options.List("placement", "nova_vf_aliases", "",
		"Nova-owned VF GPUs: the names of Nova's PCI aliases ([pci] alias) that select their VFs, each with the "+
			"resource class (one of nova_vf_resource_classes) of those VFs, as ALIAS=CLASS. A server whose flavor's "+
			"pci_passthrough:alias names one holds that many VFs of the class's vGPU type: the bridge counts them in "+
			"its vGPU-second accounting and in its per-profile quota (Nova 26 counts neither). `vgpuctl host layout "+
			"--alias` prints the line. Example: h200x-35c=CUSTOM_VGPU_VF_1430")
	optSyncInterval = options.Duration("placement", "sync_interval", time.Minute, time.Second, 24*time.Hour,
		"Time between incremental syncs (providers whose generation moved). Example: 30s")
	optFullSyncInterval = options.Duration("placement", "full_sync_interval", time.Hour, time.Minute, 7*24*time.Hour,
		"Time between full syncs, which re-read every provider. Example: 6h")
	optSyncConcurrency = options.Int("placement", "sync_concurrency", 8, 1, 64,
		"Parallel Placement reads during a sync. Example: 16")
	optConsumerType = options.String("placement", "consumer_type", "INSTANCE",
		"consumer_type written with direct-path claims (microversion 1.38+). Example: INSTANCE")
	optStaleReportAge = options.Duration("placement", "stale_report_age", 5*time.Minute, 10*time.Second, 24*time.Hour,
		"A host whose last agent report is older than this is left out of placement decisions "+
			"(hosts that never reported are not). Example: 3m")
)

var (
	reTraitPrefix   = regexp.MustCompile(`^CUSTOM_[A-Z0-9_]*$`)
	reMicroversion1 = regexp.MustCompile(`^1\.[0-9]+$`)
)

// Options returns the [placement] options declared by this package, with
// their check.
func Options() *conf.Group { return options.WithCheck(check) }

// check tests the values of the options.
func check(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if m := optMicroversion.Get(v); !reMicroversion1.MatchString(m) {
		errs = append(errs, &conf.Error{Section: "placement", Option: "microversion", Value: m, Problem: "not a 1.N microversion; allowed: e.g. 1.39"})
	}
	if p := optTypePrefix.Get(v); !reTraitPrefix.MatchString(p) {
		errs = append(errs, &conf.Error{Section: "placement", Option: "type_trait_prefix", Value: p, Problem: "not a custom trait prefix; allowed: CUSTOM_[A-Z0-9_]*"})
	}
	for _, d := range optOwnedGPUs.Get(v) {
		if _, err := ParseOwnedDecl(d); err != nil {
			errs = append(errs, &conf.Error{Section: "placement", Option: "bridge_owned_gpus", Value: d, Problem: err.Error() + "; allowed: HOST/PCI=TYPE (a numeric or an mdev type id) or HOST/PF=mixed"})
		}
	}
	for _, d := range optNovaVFClasses.Get(v) {
		if _, _, err := ParseNovaVFClass(d); err != nil {
			errs = append(errs, &conf.Error{Section: "placement", Option: "nova_vf_resource_classes", Value: d, Problem: err.Error() + "; allowed: CUSTOM_CLASS=TYPE"})
		}
	}
	classes := novaVFClasses(optNovaVFClasses.Get(v))
	for _, d := range optNovaVFAliases.Get(v) {
		_, class, err := ParseNovaVFAlias(d)
		if err == nil && classes[class] == "" {
			err = fmt.Errorf("%q: %s is not in nova_vf_resource_classes", d, class)
		}
		if err != nil {
			errs = append(errs, &conf.Error{Section: "placement", Option: "nova_vf_aliases", Value: d, Problem: err.Error() + "; allowed: ALIAS=CLASS"})
		}
	}
	if len(optClasses.Get(v)) == 0 {
		errs = append(errs, &conf.Error{Section: "placement", Option: "vgpu_resource_classes", Problem: "is empty; allowed: VGPU or CUSTOM_* classes"})
	}
	return errs
}

// StaleReportAge is [placement] stale_report_age: hosts whose last agent
// report is older are left out of decisions.
func StaleReportAge(v *conf.Values) time.Duration { return optStaleReportAge.Get(v) }

// ConfigFrom maps [placement] to a Config. Where Placement is
// (Client.Cloud, Endpoint, Token), the auditor and Replica are the
// caller's (TraitListingMin, which no option sets, is the syncer's).
func ConfigFrom(v *conf.Values) Config {
	return Config{
		Client: ClientConfig{
			Microversion: optMicroversion.Get(v),
			Timeout:      optTimeout.Get(v),
		},
		Classes:          optClasses.Get(v),
		TypePrefix:       optTypePrefix.Get(v),
		SyncInterval:     optSyncInterval.Get(v),
		FullSyncInterval: optFullSyncInterval.Get(v),
		SyncConcurrency:  optSyncConcurrency.Get(v),
		AddTypeTraits:    optAddTypeTraits.Get(v),
		AddDriverTraits:  optAddDriverTraits.Get(v),
		StaleReportAge:   optStaleReportAge.Get(v),
		ConsumerType:     optConsumerType.Get(v),
		OwnedGPUs:        ownedDecls(optOwnedGPUs.Get(v)),
		RetypeOnDemand:   optRetypeOnDemand.Get(v),
		NovaVFClasses:    novaVFClasses(optNovaVFClasses.Get(v)),
	}
}

// novaVFClasses parses [placement] nova_vf_resource_classes (check has
// refused what does not parse); nil for none.
func novaVFClasses(list []string) map[string]string {
	var out map[string]string
	for _, s := range list {
		if class, typeID, err := ParseNovaVFClass(s); err == nil {
			if out == nil {
				out = map[string]string{}
			}
			out[class] = typeID
		}
	}
	return out
}

// NovaVFAliases is [placement] nova_vf_aliases with each alias's class
// typed by nova_vf_resource_classes (check has refused the rest); nil for
// none.
func NovaVFAliases(v *conf.Values) map[string]NovaVFAlias {
	classes := novaVFClasses(optNovaVFClasses.Get(v))
	var out map[string]NovaVFAlias
	for _, s := range optNovaVFAliases.Get(v) {
		alias, class, err := ParseNovaVFAlias(s)
		if err != nil || classes[class] == "" {
			continue
		}
		if out == nil {
			out = map[string]NovaVFAlias{}
		}
		out[alias] = NovaVFAlias{Class: class, TypeID: classes[class]}
	}
	return out
}

// ownedDecls parses [placement] bridge_owned_gpus (check has refused
// what does not parse).
func ownedDecls(list []string) []OwnedDecl {
	var out []OwnedDecl
	for _, s := range list {
		if d, err := ParseOwnedDecl(s); err == nil {
			out = append(out, d)
		}
	}
	return out
}

var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })

// DefaultConfig returns the defaults of the [placement] options: the
// values a zero field of Config (and of its Client) takes.
func DefaultConfig() Config { return defaults() }
