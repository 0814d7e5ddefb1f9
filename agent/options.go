package agent

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/executor"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// SampleTitle heads etc/vgpu-bridge/agent.conf.sample.
const SampleTitle = "vgpu-agent: sample configuration (/etc/vgpu-bridge/agent.conf)"

// ReferenceTitle heads the documentation's reference of agent.conf.
const ReferenceTitle = "vgpu-agent configuration (agent.conf)"

var (
	optHost = defaultOptions.String(conf.DefaultSection, "host", "",
		"Nova's compute service host of this machine: the same value as nova-compute's [DEFAULT] host "+
			"(the suffix of its notifications' publisher_id). Empty means the machine's host name. Example: compute-0012")
	optTransportURL = defaultOptions.Secret(conf.DefaultSection, "transport_url",
		"The RabbitMQ that carries commands from the bridge, in oslo.messaging form. Use an account that may "+
			"read only this host's queue (etc/rabbitmq/). Example: rabbit://agent-compute-0012:secret@rabbit1:5672/openstack")
	optTransportURLFile = defaultOptions.String(conf.DefaultSection, "transport_url_file", "",
		"A file holding transport_url. Wins over transport_url. Example: /etc/vgpu-bridge/secrets/agent-transport_url")
	logOptions = defaultOptions.LogOptions("vgpu-agent", "drivers, security, executor, transport")
	optListen  = defaultOptions.String(conf.DefaultSection, "listen", "127.0.0.1:9798",
		"Address (host:port) of the agent's /metrics, /healthz and /readyz. Example: 0.0.0.0:9798")
	optShutdownTimeout = defaultOptions.Duration(conf.DefaultSection, "shutdown_timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long a SIGTERM may take: the command in progress finishes within it. Example: 1m")
)

// defaultOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var defaultOptions = conf.NewGroup().
	SectionHelp(conf.DefaultSection, "Process-wide settings.")

// Options assembles the options of vgpu-agent. Each section's options are
// declared once, with their defaults, in a file conf_<section>.go of this
// package ([DEFAULT]'s process-wide ones in this file); the checks of
// relations between them go with them, in this order.
//
// Renamed and removed options are listed here, each still read with a
// warning for one release:
//
//	s := conf.NewSet("VGPU_AGENT", ...)
//	s.Deprecated("old_section", "old_name", "new_section", "new_name")
//
// (new_name "" for an option that was removed). None so far.
func Options() *conf.Set {
	return conf.NewSet("VGPU_AGENT",
		amqpOptions.WithCheck(checkAMQP),
		commandsOptions,
		executor.Options(),
		journal.OptionGroup(),
		transport.Options(),
		devicesOptions.WithCheck(checkDevices),
		diagnosticsOptions,
		libvirtOptions,
		nvmlOptions,
		securityOptions.WithCheck(checkSecurity),
		sysfsOptions,
		defaultOptions,
	)
}

// LoadConfig loads and validates the configuration.
func LoadConfig(src conf.Source) (*conf.Values, error) {
	s := Options()
	v, err := s.Load(src)
	if v == nil {
		return nil, err
	}
	errs, _ := conf.AsErrors(err)
	if errs = append(errs, s.Check(v)...); len(errs) > 0 {
		errs.Sort()
		return nil, errs
	}
	return v, nil
}

// Debug reports whether [DEFAULT] debug is set.
func Debug(v *conf.Values) bool { return logOptions.Debug(v) }

// LogFormat returns [DEFAULT] log_format.
func LogFormat(v *conf.Values) string { return logOptions.Format(v) }

// LogFile returns where the daemon logs, from [DEFAULT] log_file and
// log_dir; "" for standard error.
func LogFile(v *conf.Values) string { return logOptions.File(v) }

// LogLevels returns [DEFAULT] default_log_levels.
func LogLevels(v *conf.Values) []string { return logOptions.Levels(v) }

// TransportURL returns the parsed transport URL, read from
// transport_url_file when set.
func TransportURL(v *conf.Values) (*conf.TransportURL, error) {
	raw := optTransportURL.Get(v)
	if f := optTransportURLFile.Get(v); f != "" {
		s, err := conf.ReadSecretFile(f)
		if err != nil {
			return nil, err
		}
		raw = s
	}
	tu, err := conf.ParseTransportURL(raw)
	if err != nil {
		return nil, err
	}
	if optSSL.Get(v) {
		tu.TLS = true // [amqp] ssl, oslo's [oslo_messaging_rabbit] ssl
	}
	return tu, nil
}

// Listen is the address of the agent's /metrics, /healthz and /readyz
// ([DEFAULT] listen): what `vgpu-agent healthcheck` asks.
func Listen(v *conf.Values) string { return optListen.Get(v) }
