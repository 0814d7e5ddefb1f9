package bridge

import (
	"crypto/tls"
	"fmt"
	"slices"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optNotifTransportURL = notificationsOptions.Secret("notifications", "transport_url",
		"The RabbitMQ Nova sends its notifications to, when it is not [DEFAULT] transport_url (as oslo.messaging's "+
			"[oslo_messaging_notifications] transport_url in nova.conf). Empty uses [DEFAULT] transport_url. "+
			"Example: rabbit://vgpu:secret@notify1:5672/notifications")
	optNotifTransportURLFile = notificationsOptions.String("notifications", "transport_url_file", "",
		"A file holding [notifications] transport_url. Wins over transport_url. "+
			"Example: /etc/vgpu-bridge/secrets/notifications_transport_url")
	optNotifSSLCA = notificationsOptions.String("notifications", "ssl_ca_file", "",
		"PEM CA bundle to verify RabbitMQ's certificate with (TLS transport URLs: rabbit+ssl:// or ?ssl=1); empty uses "+
			"the system's. Example: /etc/ssl/certs/rabbitmq-ca.pem").
		Also("oslo_messaging_rabbit", "ssl_ca_file")
	optNotifSSLCert = notificationsOptions.String("notifications", "ssl_cert_file", "",
		"PEM client certificate for RabbitMQ (mutual TLS). Example: /etc/vgpu-bridge/tls/rabbit.crt").
		Also("oslo_messaging_rabbit", "ssl_cert_file")
	optNotifSSLKey = notificationsOptions.String("notifications", "ssl_key_file", "",
		"PEM private key of ssl_cert_file. Example: /etc/vgpu-bridge/tls/rabbit.key").
		Also("oslo_messaging_rabbit", "ssl_key_file")
	optBrokerSSL = notificationsOptions.Bool("notifications", "ssl", false,
		"Use TLS with every RabbitMQ broker the bridge connects to ([DEFAULT], [notifications] and "+
			"[oslo_messaging_notifications] transport_url), whatever each URL's scheme says, as oslo.messaging's "+
			"[oslo_messaging_rabbit] ssl does. A URL asks for TLS itself with rabbit+ssl://, amqps:// or ?ssl=1; "+
			"false never turns that off. The broker's certificate and host name are always verified (oslo's "+
			"ssl_enforce_hostname_verification has no off switch here). Example: true").
		Also("oslo_messaging_rabbit", "ssl")
)

// parseTransportURL parses a transport URL of the bridge's: TLS when the
// URL asks for it or [notifications] ssl is set.
func parseTransportURL(v *conf.Values, raw string) (*conf.TransportURL, error) {
	tu, err := conf.ParseTransportURL(raw)
	if err != nil {
		return nil, err
	}
	if optBrokerSSL.Get(v) {
		tu.TLS = true
	}
	return tu, nil
}

// BrokerTLS is the TLS client configuration of the bridge's broker
// connections, from the [notifications] ssl_* files: nil when none of
// urls uses TLS, so that unused files are not read.
func BrokerTLS(v *conf.Values, urls ...*conf.TransportURL) (*tls.Config, error) {
	if !slices.ContainsFunc(urls, func(tu *conf.TransportURL) bool { return tu.TLS }) {
		return nil, nil
	}
	tc, err := conf.ClientTLS(conf.TLSFiles{CAFile: optNotifSSLCA.Get(v),
		CertFile: optNotifSSLCert.Get(v), KeyFile: optNotifSSLKey.Get(v)})
	if err != nil {
		return nil, fmt.Errorf("[notifications] ssl_*: %w", err)
	}
	return tc, nil
}

// notificationsOptions are the [notifications] options declared in this
// file, the broker's address and TLS files (the consumer's are package
// ingest's); Options assembles them into the daemon's set with
// validateNotifications.
var notificationsOptions = conf.NewGroup().
	SectionHelp("notifications", "Consuming Nova's versioned notifications from RabbitMQ. "+
		"Nova must send them: nova.conf [notifications] notification_format = versioned (or both) and "+
		"[oslo_messaging_notifications] driver = messagingv2.")

// validateNotifications tests relations between the options of this file.
func validateNotifications(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if u := optNotifTransportURL.Get(v); u != "" && optNotifTransportURLFile.Get(v) == "" {
		if _, err := conf.ParseTransportURL(u); err != nil {
			errs = append(errs, &conf.Error{Section: "notifications", Option: "transport_url", Value: u, Secret: true, Problem: err.Error()})
		}
	}
	if (optNotifSSLCert.Get(v) == "") != (optNotifSSLKey.Get(v) == "") {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "ssl_key_file", Value: optNotifSSLKey.Get(v),
			Problem: "ssl_cert_file and ssl_key_file go together"})
	}
	return errs
}

// NotificationsTransportURL is the broker of Nova's notifications:
// [notifications] transport_url (or its file), else [DEFAULT]'s. separate
// is true when it is a broker setting of its own.
func NotificationsTransportURL(v *conf.Values) (tu *conf.TransportURL, separate bool, err error) {
	raw := optNotifTransportURL.Get(v)
	if f := optNotifTransportURLFile.Get(v); f != "" {
		if raw, err = conf.ReadSecretFile(f); err != nil {
			return nil, true, err
		}
	}
	if raw == "" {
		tu, err = TransportURL(v)
		return tu, false, err
	}
	tu, err = parseTransportURL(v, raw)
	return tu, true, err
}

// NotificationsConfig maps [notifications] and the transport URL to
// ingest.Config (OnApplied is left for the pipeline to set).
func NotificationsConfig(v *conf.Values, tu *conf.TransportURL) (ingest.Config, error) {
	c := ingest.ConfigFrom(v)
	c.URLs = tu.AMQPURLs()
	tc, err := BrokerTLS(v, tu)
	c.TLS = tc
	return c, err
}
