package bridge

import (
	"context"
	"regexp"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

var (
	optPlacementEndpoint = placementOptions.String("placement", "endpoint_override", "",
		"Placement's URL, instead of the one in Keystone's catalog. Example: http://127.0.0.1:8778")
	optPlacementTokenFile = placementOptions.String("placement", "token_file", "",
		"A file holding a static token sent as X-Auth-Token, for Placement run with auth_strategy = noauth2 "+
			"(whose token is \"admin\"); used with endpoint_override instead of Keystone. Example: /etc/vgpu-bridge/secrets/placement-token")
	optPlacementMicroversion = placementOptions.String("placement", "microversion", placement.DefaultMicroversion,
		"Placement microversion of every request (OpenStack-API-Version: placement X); 1.38 or later for consumer types. Example: 1.39")
	optPlacementTimeout = placementOptions.Duration("placement", "timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long one Placement request may take. Example: 30s")
	optPlacementClasses = placementOptions.List("placement", "vgpu_resource_classes", "VGPU",
		"Resource classes whose inventory makes a provider a physical GPU, first match wins. "+
			"Example: VGPU,CUSTOM_VGPU_A16")
	optPlacementTypePrefix = placementOptions.String("placement", "type_trait_prefix", "CUSTOM_NVIDIA_",
		"Prefix of the traits that name a GPU's vGPU type (CUSTOM_ + upper-cased type id, as Nova names them). Example: CUSTOM_NVIDIA_")
	optPlacementAddTypeTraits = placementOptions.Bool("placement", "add_type_traits", false,
		"Opt-in: add to each GPU provider that has no type_trait_prefix trait the type its host's agent reports "+
			"(creating the CUSTOM_ trait when missing), so that Nova's scheduler and vGPU flavors see it. The bridge "+
			"never removes a trait and never changes an inventory; each trait added is audited. Needs a Placement "+
			"account allowed to write traits. Example: true")
	optPlacementSyncInterval = placementOptions.Duration("placement", "sync_interval", time.Minute, time.Second, 24*time.Hour,
		"Time between incremental syncs (providers whose generation moved). Example: 30s")
	optPlacementFullSyncInterval = placementOptions.Duration("placement", "full_sync_interval", time.Hour, time.Minute, 7*24*time.Hour,
		"Time between full syncs, which re-read every provider. Example: 6h")
	optPlacementSyncConcurrency = placementOptions.Int("placement", "sync_concurrency", 8, 1, 64,
		"Parallel Placement reads during a sync. Example: 16")
	optPlacementConsumerType = placementOptions.String("placement", "consumer_type", "INSTANCE",
		"consumer_type written with direct-path claims (microversion 1.38+). Example: INSTANCE")
)

var (
	reTraitPrefix   = regexp.MustCompile(`^CUSTOM_[A-Z0-9_]*$`)
	reMicroversion1 = regexp.MustCompile(`^1\.[0-9]+$`)
)

// placementOptions are the options declared in this file; Options assembles them
// into the daemon's set with validatePlacement.
var placementOptions = conf.NewGroup().
	SectionHelp("placement", "The Placement API: inventory mirror, placement decisions and direct-path claims.")

// validatePlacement tests relations between the options of this file.
func validatePlacement(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if m := optPlacementMicroversion.Get(v); !reMicroversion1.MatchString(m) {
		errs = append(errs, &conf.Error{Section: "placement", Option: "microversion", Value: m, Problem: "not a 1.N microversion; allowed: e.g. 1.39"})
	}
	if p := optPlacementTypePrefix.Get(v); !reTraitPrefix.MatchString(p) {
		errs = append(errs, &conf.Error{Section: "placement", Option: "type_trait_prefix", Value: p, Problem: "not a custom trait prefix; allowed: CUSTOM_[A-Z0-9_]*"})
	}
	if len(optPlacementClasses.Get(v)) == 0 {
		errs = append(errs, &conf.Error{Section: "placement", Option: "vgpu_resource_classes", Problem: "is empty; allowed: VGPU or CUSTOM_* classes"})
	}
	return errs
}

// PlacementConfig maps [placement] and [openstack] to placement.Config.
func PlacementConfig(v *conf.Values, replica string) (placement.Config, error) {
	if err := checkOpenStackCloud(v); err != nil {
		return placement.Config{}, err
	}
	cc := placement.ClientConfig{
		Cloud:        optOpenStackCloud.Get(v),
		Endpoint:     optPlacementEndpoint.Get(v),
		Microversion: optPlacementMicroversion.Get(v),
		Timeout:      optPlacementTimeout.Get(v),
		// X-OpenStack-Request-ID of the operation being served (API call or notification).
		WrapTransport: requestid.Transport,
	}
	if f := optPlacementTokenFile.Get(v); f != "" {
		tok, err := conf.ReadSecretFile(f)
		if err != nil {
			return placement.Config{}, err
		}
		cc.Token = tok
	}
	return placement.Config{
		Client:           cc,
		Classes:          optPlacementClasses.Get(v),
		TypePrefix:       optPlacementTypePrefix.Get(v),
		SyncInterval:     optPlacementSyncInterval.Get(v),
		FullSyncInterval: optPlacementFullSyncInterval.Get(v),
		SyncConcurrency:  optPlacementSyncConcurrency.Get(v),
		StaleReportAge:   placement.StaleReportAge(v),
		ConsumerType:     optPlacementConsumerType.Get(v),
		AddTypeTraits:    optPlacementAddTypeTraits.Get(v),
		Replica:          replica,
	}, nil
}

// setupPlacement builds the placement feature, registers its routes on
// srv and returns its sync loop; bridge.Run calls it at the features
// mark:
//
//	pl, plComp, err := setupPlacement(ctx, w, pol.Catalog())
//	if err != nil { return err }
//	comps = append(comps, plComp)
//
// pl is what the pipeline uses: DryRun, Claim, Release, LookupVGPU.
func setupPlacement(ctx context.Context, w *wiring, cat *catalog.Catalog) (*placement.Service, component, error) {
	v, replica, pool, srv, log := w.v, w.replica, w.pool, w.srv, w.log
	pc, err := PlacementConfig(v, replica)
	if err != nil {
		return nil, component{}, err
	}
	if pool != nil {
		pc.Auditor = requests.Auditor{DB: pool, Actor: "vgpu-bridge/" + replica}
	}
	svc, err := placement.New(ctx, pc, pool, cat, log.With("component", "placement"))
	if err != nil {
		return nil, component{}, err
	}
	ph := placementapi.New(svc)
	ph.Marks = w.ctl // drains and disabled services in /v1/hosts and /v1/gpus
	ph.Register(srv)
	return svc, component{name: "placement", run: svc.Run}, nil
}
