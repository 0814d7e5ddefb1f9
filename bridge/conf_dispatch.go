package bridge

import (
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// DispatchConfig is dispatch.Config of this replica and broker (the
// [dispatch] options are package dispatch's; TLS is set by the caller
// from [notifications]).
func DispatchConfig(v *conf.Values, tu *conf.TransportURL, replica string) dispatch.Config {
	c := dispatch.ConfigFrom(v)
	c.URLs = tu.AMQPURLs()
	c.Replica = replica
	return c
}
