package bridge

import (
	"cmp"
	"crypto/tls"
	"os"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/usage"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optOutTransportURL = accountingOptions.Secret("oslo_messaging_notifications", "transport_url",
		"The RabbitMQ the bridge publishes its own notifications to. Empty uses the broker of [notifications] "+
			"(Nova's notifications), which defaults to [DEFAULT] transport_url. Example: rabbit://vgpu:secret@notify1:5672/notifications")
	optOutTransportURLFile = accountingOptions.String("oslo_messaging_notifications", "transport_url_file", "",
		"A file holding [oslo_messaging_notifications] transport_url. Wins over transport_url. "+
			"Example: /etc/vgpu-bridge/secrets/notifications_out_transport_url")

	optAcctPeriod = accountingOptions.String("accounting", "audit_period", "hour",
		"Length of an audit period, as Nova's instance_usage_audit_period: hour, day, month, year, or a duration that "+
			"divides a day (15m). When one ends, its usage is closed and one vgpu.exists per vGPU held in it is sent. Example: day")
	optAcctCloseDelay = accountingOptions.Duration("accounting", "close_delay", 5*time.Minute, 0, 24*time.Hour,
		"How long after its end an audit period is closed: events from before the end that reach the bridge later "+
			"than this (a notification held up in the broker, an agent's late result) still correct GET /v1/usage but "+
			"not the vgpu.exists already sent. Example: 15m")
	optAcctExists = accountingOptions.Bool("accounting", "exists_notifications", true,
		"Send vgpu.exists for each vGPU held in a closed audit period. Example: false")
)

// accountingOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateAccounting.
var accountingOptions = conf.NewGroup().
	SectionHelp("oslo_messaging_notifications", "The bridge's own notifications, in oslo.messaging's versioned "+
		"format, on an exchange of their own (doc: accounting). Each is queued in the transaction of the change it "+
		"reports and published once committed.").
	SectionHelp("accounting", "vGPU usage accounting: GET /v1/usage, vgpuctl usage and the audit periods closed "+
		"with vgpu.exists notifications.")

// validateAccounting tests relations between the options of this file.
func validateAccounting(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if u := optOutTransportURL.Get(v); u != "" && optOutTransportURLFile.Get(v) == "" {
		if _, err := conf.ParseTransportURL(u); err != nil {
			errs = append(errs, &conf.Error{Section: "oslo_messaging_notifications", Option: "transport_url", Value: u, Secret: true,
				Problem: err.Error()})
		}
	}
	if w := outBrokerWarning(v); w != "" {
		v.Warnings = append(v.Warnings, w)
	}
	if _, err := usage.ParsePeriod(optAcctPeriod.Get(v)); err != nil {
		errs = append(errs, &conf.Error{Section: "accounting", Option: "audit_period", Value: optAcctPeriod.Get(v), Problem: err.Error()})
	}
	return errs
}

// outBrokerWarning warns when the bridge publishes to a broker of its
// own but reads Nova's notifications from [DEFAULT] transport_url: in
// nova.conf, [oslo_messaging_notifications] transport_url is where Nova
// sends them, so a section pasted from it moves the bridge's publishing
// there and not its consumer, which then waits in vain.
func outBrokerWarning(v *conf.Values) string {
	out := optOutTransportURL.Get(v)
	if out == "" && optOutTransportURLFile.Get(v) == "" {
		return ""
	}
	if optNotifTransportURL.Get(v) != "" || optNotifTransportURLFile.Get(v) != "" {
		return ""
	}
	if out != "" && out == optTransportURL.Get(v) {
		return ""
	}
	return "[oslo_messaging_notifications] transport_url is where the bridge sends its own notifications; it reads " +
		"Nova's from [DEFAULT] transport_url. If Nova sends its notifications there too (nova.conf's " +
		"[oslo_messaging_notifications] transport_url), set [notifications] transport_url to it"
}

// OutTransportURL is the broker the bridge publishes its own
// notifications to: [oslo_messaging_notifications] transport_url (or its
// file), else the broker of Nova's notifications.
func OutTransportURL(v *conf.Values, notifications *conf.TransportURL) (*conf.TransportURL, error) {
	raw := optOutTransportURL.Get(v)
	if f := optOutTransportURLFile.Get(v); f != "" {
		var err error
		if raw, err = conf.ReadSecretFile(f); err != nil {
			return nil, err
		}
	}
	if raw == "" {
		return notifications, nil
	}
	return parseTransportURL(v, raw)
}

// NotifyConfig maps [oslo_messaging_notifications] (package notify's
// options) to notify.Config, reconnecting as the consumer of Nova's
// notifications does ([notifications] reconnect_*); the brokers, the
// publisher id and Replica are the caller's.
func NotifyConfig(v *conf.Values) notify.Config {
	c := notify.ConfigFrom(v)
	ic := ingest.ConfigFrom(v)
	c.ReconnectMin, c.ReconnectMax = ic.ReconnectMin, ic.ReconnectMax
	return c
}

// setupAccounting wires GET /v1/usage, the audit-period closer and the
// relay of the bridge's own notifications to tu (TLS with tc, the
// [notifications] ssl_* files).
func setupAccounting(w *wiring, tu *conf.TransportURL, tc *tls.Config) ([]component, error) {
	period, err := usage.ParsePeriod(optAcctPeriod.Get(w.v))
	if err != nil {
		return nil, err
	}
	(&usage.API{Pool: w.pool, Period: period}).Register(w.srv)
	closer := &usage.Closer{Pool: w.pool, Period: period, Exists: optAcctExists.Get(w.v), Delay: optAcctCloseDelay.Get(w.v), Replica: w.replica,
		Log: w.log.With("component", "usage")}

	host, _ := os.Hostname()
	rc := NotifyConfig(w.v)
	rc.URLs = tu.AMQPURLs()
	rc.PublisherID = "vgpu-bridge:" + cmp.Or(w.replica, host)
	rc.Replica = w.replica
	if tu.TLS {
		rc.TLS = tc // [notifications] ssl_* files
	}
	relay, err := notify.New(rc, w.pool, w.reg, w.log.With("component", "notify"))
	if err != nil {
		return nil, err
	}
	return []component{{"usage", closer.Run}, {"notify", relay.Run}}, nil
}
