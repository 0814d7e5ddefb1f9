package bridge

import (
	"context"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/novaresize"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

var (
	optNovaEndpoint = novaOptions.String("nova", "endpoint_override", "",
		"Nova's compute API URL, instead of the one in Keystone's catalog. With token_file it replaces Keystone "+
			"(nova-api run with [api] auth_strategy = noauth2). The Nova-native path (attach_mode: nova-resize, the "+
			"policy's default) is off unless this and token_file, or [openstack] cloud, are set. Example: http://127.0.0.1:8774/v2.1")
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

// setupNova builds Nova's client for the pipeline; nil (no error) when
// Nova is not configured. setupPipeline gives it to the Nova-native path.
func setupNova(ctx context.Context, v *conf.Values) (novaresize.Nova, error) {
	c, ok, err := NovaConfig(v)
	if err != nil || !ok {
		return nil, err
	}
	nc, err := computeapi.New(ctx, c)
	if err != nil {
		return nil, err
	}
	return nc, nil
}
