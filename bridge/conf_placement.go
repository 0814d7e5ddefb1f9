package bridge

import (
	"context"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

var (
	optPlacementEndpoint = placementOptions.String("placement", "endpoint_override", "",
		"Placement's URL, instead of the one in Keystone's catalog. Example: http://127.0.0.1:8778")
	optPlacementTokenFile = placementOptions.String("placement", "token_file", "",
		"A file holding a static token sent as X-Auth-Token, for Placement run with auth_strategy = noauth2 "+
			"(whose token is \"admin\"); used with endpoint_override instead of Keystone. Example: /etc/vgpu-bridge/secrets/placement-token")
)

// placementOptions are the options declared in this file, how Placement
// is reached without Keystone's catalog (the rest of [placement] is
// package placement's); Options assembles them into the daemon's set.
var placementOptions = conf.NewGroup().
	SectionHelp("placement", "The Placement API: inventory mirror, placement decisions and direct-path claims.")

// PlacementConfig maps [placement] and [openstack] to placement.Config:
// package placement's options, and how to reach Placement.
func PlacementConfig(v *conf.Values, replica string) (placement.Config, error) {
	if err := checkOpenStackCloud(v); err != nil {
		return placement.Config{}, err
	}
	pc := placement.ConfigFrom(v)
	pc.Client.Cloud = optOpenStackCloud.Get(v)
	pc.Client.Endpoint = optPlacementEndpoint.Get(v)
	// X-OpenStack-Request-ID of the operation being served (API call or notification).
	pc.Client.WrapTransport = requestid.Transport
	pc.Replica = replica
	if f := optPlacementTokenFile.Get(v); f != "" {
		tok, err := conf.ReadSecretFile(f)
		if err != nil {
			return placement.Config{}, err
		}
		pc.Client.Token = tok
	}
	return pc, nil
}

// setupPlacement builds the placement feature, registers its routes on
// srv and returns its sync loop; bridge.Run calls it at the features
// mark:
//
//	pl, plComp, err := setupPlacement(ctx, w, pol)
//	if err != nil { return err }
//	comps = append(comps, plComp)
//
// pl is what the pipeline uses: DryRun, Claim, Release, LookupVGPU.
func setupPlacement(ctx context.Context, w *wiring, pol *policy.Holder) (*placement.Service, component, error) {
	v, replica, pool, srv, log := w.v, w.replica, w.pool, w.srv, w.log
	cat := pol.Catalog()
	pc, err := PlacementConfig(v, replica)
	if err != nil {
		return nil, component{}, err
	}
	// The guest driver traits follow the matrix the policy holds now (it
	// reloads with the policy's files).
	pc.GuestBranches = func(hypervisor, driver string) []int { return pol.Policy().Compat().GuestBranches(hypervisor, driver) }
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
