package bridge

import (
	"context"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/novaresize"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

var (
	optNovaEndpoint = novaOptions.String("nova", "endpoint_override", "",
		"Nova's compute API URL, instead of the one in Keystone's catalog. With token_file it replaces Keystone "+
			"(nova-api run with [api] auth_strategy = noauth2). The Nova-native path (attach_mode: nova-resize, the "+
			"policy's default) is off unless this and token_file, or [openstack] cloud, are set. Example: http://127.0.0.1:8774/v2.1")
	optNovaServerSync = novaOptions.Duration("nova", "server_sync_interval", 10*time.Minute, 0, 24*time.Hour,
		"How often the bridge lists the servers Nova changed since its last listing (GET /servers/detail with "+
			"changes-since, 5 minutes of margin), to catch up notifications it did not receive (a queue lost or "+
			"purged). The first listing, at the bridge's first start with Nova configured, reads every server, so "+
			"that instances created before the bridge are known. 0 turns the listing off. Needs an admin token "+
			"(all_tenants). Example: 10m")
	optNovaLookupAbsentTTL = novaOptions.Duration("nova", "server_lookup_absent_ttl", time.Minute, 0, time.Hour,
		"A request naming a server the bridge does not know yet (created before the bridge, not listed yet) makes the "+
			"bridge ask Nova for that one server (GET /servers/{id}) and store it as the listing does, then decide. "+
			"Nova's 404 for an id is remembered this long: requests naming that id meanwhile are rejected "+
			"unknown_instance without asking Nova again. 0 remembers nothing (every such request asks Nova). Example: 1m")
	optNovaTokenFile = novaOptions.String("nova", "token_file", "",
		"A file holding a static token sent as X-Auth-Token, used with endpoint_override instead of Keystone "+
			"(noauth2 takes \"<user>:<project>\", e.g. admin:admin). The token must be an admin's: the bridge lists "+
			"private flavors and reads servers' hosts. Example: /etc/vgpu-bridge/secrets/nova-token")
)

// novaOptions are the [nova] options that say where Nova is, declared in
// this file (the client's microversion and timeout are package
// computeapi's, the path's timings package novaresize's); Options assembles
// them into the daemon's set with validateNova.
var novaOptions = conf.NewGroup().
	SectionHelp("nova", "Nova's compute API, for the Nova-native path: the bridge resizes a server to a flavor "+
		"carrying the wanted vGPU (resources:VGPU=N and trait:CUSTOM_NVIDIA_<type>=required, same vCPUs, RAM and disk), "+
		"verifies the vGPU on the target host through its agent, then confirms or reverts.")

// validateNova tests relations between the options of this file.
func validateNova(v *conf.Values) conf.Errors {
	if (optNovaEndpoint.Get(v) == "") != (optNovaTokenFile.Get(v) == "") && optOpenStackCloud.Get(v) == "" {
		return conf.Errors{{Section: "nova", Option: "token_file", Problem: "endpoint_override and token_file go together unless [openstack] cloud is set"}}
	}
	return nil
}

// NovaConfig maps [nova] and [openstack] cloud to the client's config;
// ok is false when Nova is not configured (the Nova path is off).
func NovaConfig(v *conf.Values) (computeapi.Config, bool, error) {
	c := computeapi.ConfigFrom(v)
	c.Cloud = optOpenStackCloud.Get(v)
	c.Endpoint = optNovaEndpoint.Get(v)
	c.WrapTransport = requestid.Transport // the operation's X-OpenStack-Request-ID when a call names none
	if f := optNovaTokenFile.Get(v); f != "" {
		tok, err := conf.ReadSecretFile(f)
		if err != nil {
			return c, false, err
		}
		c.Token = tok
	}
	return c, (c.Endpoint != "" && c.Token != "") || c.Cloud != "", nil
}

// NovaPathConfig is novaresize.Config (the [nova] timings of the path are
// package novaresize's) with the lease of a Nova call: twice [nova]
// timeout.
func NovaPathConfig(v *conf.Values) novaresize.Config {
	c := novaresize.ConfigFrom(v)
	c.CallLease = 2 * computeapi.ConfigFrom(v).Timeout
	return c
}

// novaPath is the wiring's Nova client as the Nova-native path sees it;
// nil (not a typed nil) when Nova is not configured.
func novaPath(w *wiring) novaresize.Nova {
	if w.nova == nil {
		return nil
	}
	return w.nova
}

// novaClient is Nova's client as [nova] and [openstack] configure it; nil
// (no error) when Nova is not configured.
func novaClient(ctx context.Context, v *conf.Values) (*computeapi.Client, error) {
	c, ok, err := NovaConfig(v)
	if err != nil || !ok {
		return nil, err
	}
	return computeapi.New(ctx, c)
}

// setupServerSync lists Nova's servers into the instances ([nova]
// server_sync_interval) with the wiring's Nova client; no component when
// Nova is not configured or the listing is off.
func setupServerSync(w *wiring, skew time.Duration) *component {
	every := optNovaServerSync.Get(w.v)
	if every <= 0 || w.nova == nil {
		return nil
	}
	s := &ingest.ServerSync{Pool: w.pool, Nova: w.nova, Log: w.log.With("component", "nova-server-sync"), Interval: every,
		Margin: serverSyncMargin, ClockSkewTolerance: skew, Retry: backoff.Policy{Min: time.Second, Max: every}}
	return &component{"nova-server-sync", s.Run}
}

// setupLookup is the on-demand lookup of servers the bridge does not know
// (ingest.Lookup), with the wiring's Nova client; nil when Nova is not
// configured (a request naming an unknown server is then rejected at once).
func setupLookup(w *wiring) *ingest.Lookup {
	if w.nova == nil {
		return nil
	}
	return ingest.NewLookup(ingest.LookupConfig{AbsentTTL: optNovaLookupAbsentTTL.Get(w.v),
		ClockSkewTolerance: ingest.ConfigFrom(w.v).ClockSkewTolerance}, w.pool, w.nova, w.reg)
}

// instanceLookup is the wiring's lookup as the pipeline and the webhooks
// see it: nil (not a typed nil) when Nova is not configured.
func instanceLookup(w *wiring) pipeline.InstanceLookup {
	if w.lookup == nil {
		return nil
	}
	return w.lookup
}

// serverSyncMargin is taken off the last listing's start when the bridge
// asks Nova for the servers changed since: Nova compares with its own
// clock, and a server changed while the last listing ran is listed again.
const serverSyncMargin = 5 * time.Minute
