package bridge

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optTransportURL = defaultOptions.Secret(conf.DefaultSection, "transport_url",
		"The RabbitMQ that carries Nova's notifications and the agents' commands, in oslo.messaging form. "+
			"Several hosts are tried in order; the path is the virtual host. Use the same URL as Nova's "+
			"[DEFAULT] transport_url, or a dedicated account with the permissions of etc/rabbitmq/. "+
			"Example: rabbit://vgpu:secret@rabbit1:5672,vgpu:secret@rabbit2:5672/openstack")
	optTransportURLFile = defaultOptions.String(conf.DefaultSection, "transport_url_file", "",
		"A file holding transport_url (so the password stays out of this file). Wins over transport_url. "+
			"Example: /etc/vgpu-bridge/secrets/transport_url")
	optHost = defaultOptions.String(conf.DefaultSection, "host", "",
		"Name of this bridge replica in logs and locks. Empty means the machine's host name. Example: bridge-1")
	logOptions         = defaultOptions.LogOptions("vgpu-bridge", "api, dispatch, drift, notifications, pipeline, placement, policy, webhooks…")
	optShutdownTimeout = defaultOptions.Duration(conf.DefaultSection, "shutdown_timeout", 30*time.Second, time.Second, 10*time.Minute,
		"How long a SIGTERM may take: in-flight requests and batches finish within it. Example: 1m")
)

// defaultOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateDefault.
var defaultOptions = conf.NewGroup().
	SectionHelp(conf.DefaultSection, "Process-wide settings.")

// validateDefault tests relations between the options of this file.
func validateDefault(v *conf.Values) conf.Errors {
	if optTransportURLFile.Get(v) != "" {
		return nil
	}
	u := optTransportURL.Get(v)
	if u == "" {
		return conf.Errors{{Section: conf.DefaultSection, Option: "transport_url", Problem: "is required (or set transport_url_file); allowed: rabbit://user:pass@host:5672/vhost"}}
	}
	if _, err := conf.ParseTransportURL(u); err != nil {
		return conf.Errors{{Section: conf.DefaultSection, Option: "transport_url", Value: u, Secret: true, Problem: err.Error()}}
	}
	return nil
}

// TransportURL returns the parsed [DEFAULT] transport_url, read from
// transport_url_file when that is set.
func TransportURL(v *conf.Values) (*conf.TransportURL, error) {
	raw := optTransportURL.Get(v)
	if f := optTransportURLFile.Get(v); f != "" {
		s, err := conf.ReadSecretFile(f)
		if err != nil {
			return nil, err
		}
		raw = s
	}
	return parseTransportURL(v, raw)
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
