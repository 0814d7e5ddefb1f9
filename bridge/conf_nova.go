package bridge

import (
	"context"
	"time"

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
	optNovaMicroversion = novaOptions.String("nova", "microversion", computeapi.DefaultMicroversion,
		"Compute API microversion of every request; 2.61 or later (flavors with their extra specs). Example: 2.79")
	optNovaTimeout = novaOptions.Duration("nova", "timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long one Nova API request may take. Example: 30s")
	optNovaResizeTimeout = novaOptions.Duration("nova", "resize_timeout", 10*time.Minute, time.Second, 24*time.Hour,
		"How long Nova may take from the resize call to instance.resize_finish.end (the disk copy of a cold migration "+
			"included). A resize still running then is followed to its end (the request shows phase overdue) and "+
			"then handled as on_deadline says. Example: 30m")
	optNovaOnDeadline = novaOptions.Choice("nova", "on_deadline", "revert", []string{"revert", "confirm"},
		"What becomes of a resize Nova finishes after resize_timeout: revert (the server goes back to its flavor, "+
			"the request fails with code nova_timeout) or confirm (the vGPU is verified and the resize confirmed as if "+
			"it were on time). Either way the server is never left in VERIFY_RESIZE. Example: confirm")
	optNovaOverdueCheck = novaOptions.Duration("nova", "overdue_check_interval", 10*time.Second, 100*time.Millisecond, time.Hour,
		"How often the server of a resize past its deadline is read while the bridge follows it to its end. Example: 30s")
	optNovaVerifyTimeout = novaOptions.Duration("nova", "verify_timeout", 2*time.Minute, time.Second, 24*time.Hour,
		"How long the target host's agent may take to answer verify_vgpu after the resize; past it the resize is "+
			"reverted and the request fails with code agent_timeout. Example: 5m")
	optNovaConfirmTimeout = novaOptions.Duration("nova", "confirm_timeout", 5*time.Minute, time.Second, 24*time.Hour,
		"How long confirmResize or revertResize may take to their .end notification; the server is read then "+
			"and the request ends by what it shows. Example: 10m")
	optNovaPollInterval = novaOptions.Duration("nova", "poll_interval", 500*time.Millisecond, 10*time.Millisecond, time.Minute,
		"How often each replica looks for due Nova calls and passed deadlines of resizes. Example: 1s")
)

// novaOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateNova.
var novaOptions = conf.NewGroup().
	SectionHelp("nova", "Nova's compute API, for the Nova-native path: the bridge resizes a server to a flavor "+
		"carrying the wanted vGPU (resources:VGPU=N and trait:CUSTOM_NVIDIA_<type>=required, same vCPUs, RAM and disk), "+
		"verifies the vGPU on the target host through its agent, then confirms or reverts.")

// validateNova tests relations between the options of this file.
func validateNova(v *conf.Values) conf.Errors {
	if m := optNovaMicroversion.Get(v); computeapi.CheckMicroversion(m) != nil {
		return conf.Errors{{Section: "nova", Option: "microversion", Value: m, Problem: "not a 2.N microversion of 2.61 or later; allowed: e.g. 2.79"}}
	}
	if (optNovaEndpoint.Get(v) == "") != (optNovaTokenFile.Get(v) == "") && optOpenStackCloud.Get(v) == "" {
		return conf.Errors{{Section: "nova", Option: "token_file", Problem: "endpoint_override and token_file go together unless [openstack] cloud is set"}}
	}
	return nil
}

// NovaConfig maps [nova] and [openstack] cloud to the client's config;
// ok is false when Nova is not configured (the Nova path is off).
func NovaConfig(v *conf.Values) (computeapi.Config, bool, error) {
	c := computeapi.Config{
		Cloud:         optOpenStackCloud.Get(v),
		Endpoint:      optNovaEndpoint.Get(v),
		Microversion:  optNovaMicroversion.Get(v),
		Timeout:       optNovaTimeout.Get(v),
		WrapTransport: requestid.Transport, // the operation's X-OpenStack-Request-ID when a call names none
	}
	if f := optNovaTokenFile.Get(v); f != "" {
		tok, err := conf.ReadSecretFile(f)
		if err != nil {
			return c, false, err
		}
		c.Token = tok
	}
	return c, (c.Endpoint != "" && c.Token != "") || c.Cloud != "", nil
}

// NovaPathConfig maps the [nova] timings to the Nova-native path's.
func NovaPathConfig(v *conf.Values) novaresize.Config {
	return novaresize.Config{
		ResizeTimeout:  optNovaResizeTimeout.Get(v),
		VerifyTimeout:  optNovaVerifyTimeout.Get(v),
		ConfirmTimeout: optNovaConfirmTimeout.Get(v),
		PollInterval:   optNovaPollInterval.Get(v),
		CallLease:      2 * optNovaTimeout.Get(v),
		OnDeadline:     optNovaOnDeadline.Get(v),
		OverdueCheck:   optNovaOverdueCheck.Get(v),
	}
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
