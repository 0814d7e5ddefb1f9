package agent

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// Options declares every option of vgpu-agent. Each section's options are
// declared in a file conf_<section>.go of this package.
var Options = conf.NewSet("VGPU_AGENT")

// SampleTitle heads etc/vgpu-bridge/agent.conf.sample.
const SampleTitle = "vgpu-agent: sample configuration (/etc/vgpu-bridge/agent.conf)"

// ReferenceTitle heads the documentation's reference of agent.conf.
const ReferenceTitle = "vgpu-agent configuration (agent.conf)"

var (
	optHost = Options.String(conf.DefaultSection, "host", "",
		"Nova's compute service host of this machine: the same value as nova-compute's [DEFAULT] host "+
			"(the suffix of its notifications' publisher_id). Empty means the machine's host name. Example: compute-0012")
	optTransportURL = Options.Secret(conf.DefaultSection, "transport_url",
		"The RabbitMQ that carries commands from the bridge, in oslo.messaging form. Use an account that may "+
			"read only this host's queue (etc/rabbitmq/). Example: rabbit://agent-compute-0012:secret@rabbit1:5672/openstack")
	optTransportURLFile = Options.String(conf.DefaultSection, "transport_url_file", "",
		"A file holding transport_url. Wins over transport_url. Example: /etc/vgpu-bridge/secrets/agent-transport_url")
	optDebug = Options.Bool(conf.DefaultSection, "debug", false,
		"Log at debug level. Example: true")
	optLogFormat = Options.Choice(conf.DefaultSection, "log_format", "json", []string{"json", "text"},
		"Format of the log lines written to standard error. Example: text")
	optListen = Options.String(conf.DefaultSection, "listen", "127.0.0.1:9798",
		"Address (host:port) of the agent's /metrics, /healthz and /readyz. Example: 0.0.0.0:9798")
	optShutdownTimeout = Options.Duration(conf.DefaultSection, "shutdown_timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long a SIGTERM may take: the command in progress finishes within it. Example: 1m")
)

func init() {
	Options.SectionHelp(conf.DefaultSection, "Process-wide settings.")
}

// LoadConfig loads and validates the configuration.
func LoadConfig(src conf.Source) (*conf.Values, error) {
	v, err := Options.Load(src)
	if v == nil {
		return nil, err
	}
	errs, _ := conf.AsErrors(err)
	for _, f := range validators {
		errs = append(errs, f(v)...)
	}
	if len(errs) > 0 {
		errs.Sort()
		return nil, errs
	}
	return v, nil
}

// validators check relations between options; conf_<section>.go files add
// theirs in init.
var validators []func(v *conf.Values) conf.Errors

// Debug reports whether [DEFAULT] debug is set.
func Debug(v *conf.Values) bool { return optDebug.Get(v) }

// LogFormat returns [DEFAULT] log_format.
func LogFormat(v *conf.Values) string { return optLogFormat.Get(v) }

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
	return conf.ParseTransportURL(raw)
}

// Renamed and removed options are listed here, each still read with a
// warning for one release (conf.Set.Deprecated), in an init function:
//
//	Options.Deprecated("old_section", "old_name", "new_section", "new_name")
//
// (new_name "" for an option that was removed). None so far.
