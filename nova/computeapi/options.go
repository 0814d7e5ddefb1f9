package computeapi

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [nova] options of the client, declared once with their
// defaults: the bridge's set takes them from Options, and DefaultConfig
// (the values a zero Config field takes) is built from them. Where Nova
// is (endpoint, token, cloud) is the bridge's.
var options = conf.NewGroup()

var (
	optMicroversion = options.String("nova", "microversion", DefaultMicroversion,
		"Compute API microversion of every request; 2.61 or later (flavors with their extra specs). Example: 2.79")
	optTimeout = options.Duration("nova", "timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long one Nova API request may take. Example: 30s")
)

// Options returns the [nova] options declared by this package, with their
// check.
func Options() *conf.Group { return options.WithCheck(check) }

func check(v *conf.Values) conf.Errors {
	if m := optMicroversion.Get(v); CheckMicroversion(m) != nil {
		return conf.Errors{{Section: "nova", Option: "microversion", Value: m, Problem: "not a 2.N microversion of 2.61 or later; allowed: e.g. 2.79"}}
	}
	return nil
}

// ConfigFrom maps the [nova] options of the client to a Config; where
// Nova is and how to call it (Cloud, Endpoint, Token, transports) are the
// caller's.
func ConfigFrom(v *conf.Values) Config {
	return Config{Microversion: optMicroversion.Get(v), Timeout: optTimeout.Get(v)}
}

var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })

// DefaultConfig returns the defaults of the [nova] options of the client:
// the values a zero Microversion or Timeout takes.
func DefaultConfig() Config { return defaults() }
