package agent

import (
	"crypto/tls"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// [amqp]: TLS to RabbitMQ, used when transport_url is rabbit+ssl://,
// amqps:// or has ?ssl=1, or [amqp] ssl is set. The names follow oslo.messaging's
// [oslo_messaging_rabbit] ssl_* options so nova.conf's values can be copied.
var (
	optSSLCAFile = amqpOptions.String("amqp", "ssl_ca_file", "",
		"PEM file of the CA certificates that sign RabbitMQ's server certificates; they replace the system's roots. "+
			"Empty: the system's roots. The server certificate is always verified. Example: /etc/ssl/rabbitmq/ca.pem").
		Also("oslo_messaging_rabbit", "ssl_ca_file")
	optSSLCertFile = amqpOptions.String("amqp", "ssl_cert_file", "",
		"PEM client certificate presented to RabbitMQ (for ssl_options.fail_if_no_peer_cert = true). Goes with "+
			"ssl_key_file. Read at each connection, so a renewed certificate is used at the next one. "+
			"Example: /etc/vgpu-bridge/tls/agent.crt").
		Also("oslo_messaging_rabbit", "ssl_cert_file")
	optSSLKeyFile = amqpOptions.String("amqp", "ssl_key_file", "",
		"PEM private key of ssl_cert_file; must not be readable by others. Example: /etc/vgpu-bridge/tls/agent.key").
		Also("oslo_messaging_rabbit", "ssl_key_file")
	optSSL = amqpOptions.Bool("amqp", "ssl", false,
		"Use TLS with every broker of transport_url, whatever its scheme says, as oslo.messaging's "+
			"[oslo_messaging_rabbit] ssl does (so nova-compute's setting can be copied). A URL asks for TLS itself with "+
			"rabbit+ssl://, amqps:// or ?ssl=1; false never turns that off. Example: true").
		Also("oslo_messaging_rabbit", "ssl")
	optSSLServerName = amqpOptions.String("amqp", "ssl_server_name", "",
		"Name RabbitMQ's certificate must carry (SAN), when it differs from the host in transport_url (e.g. brokers "+
			"reached by IP address). Empty: each broker's host name from transport_url. Example: rabbit.example.org")
)

// amqpOptions are the options declared in this file; Options assembles them
// into the daemon's set with checkAMQP.
var amqpOptions = conf.NewGroup().
	SectionHelp("amqp", "TLS to RabbitMQ (transport_url rabbit+ssl://, amqps:// or ?ssl=1).")

// checkAMQP tests relations between the options of this file.
func checkAMQP(v *conf.Values) conf.Errors {
	if (optSSLCertFile.Get(v) == "") != (optSSLKeyFile.Get(v) == "") {
		return conf.Errors{{Section: "amqp", Option: "ssl_key_file", Value: optSSLKeyFile.Get(v),
			Problem: "ssl_cert_file and ssl_key_file go together"}}
	}
	return nil
}

// tlsFiles returns the [amqp] TLS settings.
func tlsFiles(v *conf.Values) conf.TLSFiles {
	return conf.TLSFiles{CAFile: optSSLCAFile.Get(v), CertFile: optSSLCertFile.Get(v),
		KeyFile: optSSLKeyFile.Get(v), ServerName: optSSLServerName.Get(v)}
}

// TLSConfig builds the TLS configuration of the transport from [amqp].
func TLSConfig(v *conf.Values) (*tls.Config, error) { return conf.ClientTLS(tlsFiles(v)) }
