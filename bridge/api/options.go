package api

import (
	"cmp"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [api] options the server reads, declared once with
// their defaults: the bridge's set takes them from Options, and
// DefaultConfig (the values a zero Config field takes) is built from
// them. Where the server listens, who may call it and its TLS are the
// bridge's.
var options = conf.NewGroup().
	SectionHelp("healthcheck", "GET /healthcheck, as oslo.middleware's healthcheck answers it for OpenStack services: "+
		"what load balancers and kolla's container checks ask.")

var (
	optReadHeaderTimeout = options.Duration("api", "read_header_timeout", 5*time.Second, 100*time.Millisecond, time.Minute,
		"How long a client may take to send the request headers (cuts off slowloris clients). Example: 5s")
	optReadTimeout = options.Duration("api", "read_timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long a client may take to send a whole request. Example: 30s")
	optWriteTimeout = options.Duration("api", "write_timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long an answer may take to write. Example: 30s")
	optMaxHeaderBytes = options.Int("api", "max_header_bytes", 64<<10, 4<<10, 1<<20,
		"Largest request header block accepted. Example: 65536")
	optMaxBodyBytes = options.Int("api", "max_body_bytes", 1<<20, 1<<10, 64<<20,
		"Largest request body the operator API reads. Example: 1048576")
	optDisableByFile = options.String("healthcheck", "disable_by_file_path", "",
		"While this file exists, GET /healthcheck answers 503 DISABLED BY FILE (and HEAD 503), so that a load "+
			"balancer takes this bridge out of its pool before maintenance; the rest of the API keeps answering. "+
			"Empty: /healthcheck always answers 200 OK while the process serves. "+
			"Example: /var/lib/vgpu-bridge/healthcheck_disable")
)

// Options returns the [api] options declared by this package.
func Options() *conf.Group { return options }

// ConfigFrom maps [api]'s server limits to a Config; the listener, its
// TLS, the authenticator, registry, logger and version are the caller's.
// IdleTimeout and ShutdownGrace, which no option sets, are fixed here.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		ReadHeaderTimeout: optReadHeaderTimeout.Get(v),
		ReadTimeout:       optReadTimeout.Get(v),
		WriteTimeout:      optWriteTimeout.Get(v),
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    optMaxHeaderBytes.Get(v),
		MaxBodyBytes:      int64(optMaxBodyBytes.Get(v)),
		ShutdownGrace:     15 * time.Second,
		DisableByFile:     optDisableByFile.Get(v),
	}
}

var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })

// DefaultConfig returns the defaults of the [api] options the server
// reads: the values a zero field of Config takes.
func DefaultConfig() Config { return defaults() }

// withDefaults fills c's zero limits from DefaultConfig.
func (c *Config) withDefaults() {
	d := DefaultConfig()
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, d.ReadHeaderTimeout)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, d.ReadTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, d.WriteTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, d.IdleTimeout)
	c.MaxHeaderBytes = cmp.Or(c.MaxHeaderBytes, d.MaxHeaderBytes)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, d.MaxBodyBytes)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, d.ShutdownGrace)
}
