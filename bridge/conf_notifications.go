package bridge

import (
	"fmt"
	"time"

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
	optNotifQueue = notificationsOptions.String("notifications", "queue", "vgpu-bridge.notifications",
		"The bridge's own durable queue, bound to Nova's notification topics. All replicas share it. "+
			"Never name it like a routing key (versioned_notifications.info): that queue is oslo.messaging's own. "+
			"Example: vgpu-bridge.notifications")
	optNotifQuorum = notificationsOptions.Bool("notifications", "quorum_queue", false,
		"Declare the queue as a quorum queue (x-queue-type=quorum), for clustered RabbitMQ. An existing queue "+
			"of the other type gives a 406 error naming this option. Example: true")
	optNotifExchange = notificationsOptions.String("notifications", "exchange", "nova",
		"oslo.messaging's control exchange Nova publishes to (a topic exchange). Example: nova")
	optNotifExchangeDurable = notificationsOptions.Bool("notifications", "exchange_durable", false,
		"Declare the exchange durable. Must equal Nova's [oslo_messaging_rabbit] amqp_durable_queues, or the broker "+
			"refuses with 406 PRECONDITION_FAILED. Example: true")
	optNotifExchangeAutoDelete = notificationsOptions.Bool("notifications", "exchange_auto_delete", false,
		"Declare the exchange auto-delete. Must equal Nova's [oslo_messaging_rabbit] amqp_auto_delete. Example: false")
	optNotifExchangePassive = notificationsOptions.Bool("notifications", "exchange_passive", false,
		"Only check that the exchange exists (passive declare) instead of declaring it; for accounts "+
			"without configure permission on it. Example: true")
	optNotifTopics = notificationsOptions.List("notifications", "topics", "versioned_notifications",
		"Nova's versioned notification topics ([notifications] versioned_notifications_topics in nova.conf). "+
			"Each is bound as TOPIC.PRIORITY for every priority. Example: versioned_notifications")
	optNotifPriorities = notificationsOptions.List("notifications", "priorities", "info,error",
		"Notification priorities to consume (routing key suffixes). Nova sends versioned notifications as info and error. "+
			"Example: info,error")
	optNotifPrefetch = notificationsOptions.Int("notifications", "prefetch", 1000, 1, 65535,
		"Unacknowledged messages RabbitMQ may push to this replica (AMQP QoS). At least batch_size. Example: 1000")
	optNotifBatchSize = notificationsOptions.Int("notifications", "batch_size", 250, 1, 10000,
		"Most notifications committed in one Postgres transaction (and acknowledged together after it). Example: 250")
	optNotifCommitters = notificationsOptions.Int("notifications", "committers", 2, 1, 16,
		"Batches committed concurrently (each in its own transaction); acknowledgements stay in delivery order. "+
			"prefetch should cover (committers + 2) * batch_size. Example: 2")
	optNotifFlushInterval = notificationsOptions.Duration("notifications", "flush_interval", 20*time.Millisecond, time.Millisecond, 10*time.Second,
		"Longest a partial batch waits before it is committed. Example: 50ms")
	optNotifMaxBytes = notificationsOptions.Int("notifications", "max_message_bytes", 1<<20, 1<<10, 64<<20,
		"Bigger messages are dead letters (reason oversize). Example: 1048576")
	optNotifDeadLetterBytes = notificationsOptions.Int("notifications", "dead_letter_max_bytes", 64<<10, 256, 16<<20,
		"How much of a dead letter's raw body is kept. Example: 65536")
	optNotifSilence = notificationsOptions.Duration("notifications", "silence_warning", 15*time.Minute, 0, 7*24*time.Hour,
		"Log a hint naming Nova's notification settings when no notification arrived for this long; 0 disables. "+
			"Example: 30m")
	optNotifReconnectMin = notificationsOptions.Duration("notifications", "reconnect_min", 500*time.Millisecond, 10*time.Millisecond, time.Minute,
		"First wait before reconnecting to RabbitMQ; it doubles (with jitter) up to reconnect_max. Example: 1s")
	optNotifReconnectMax = notificationsOptions.Duration("notifications", "reconnect_max", 30*time.Second, 100*time.Millisecond, 10*time.Minute,
		"Longest wait between reconnect attempts. Example: 1m")
	optNotifStallAfter = notificationsOptions.Duration("notifications", "stall_after", 30*time.Second, time.Second, time.Hour,
		"When commits of notifications to Postgres have failed for this long with none succeeding, /readyz fails "+
			"naming the error (the messages wait unacknowledged on the broker). Example: 1m")
	optNotifClockSkew = notificationsOptions.Duration("notifications", "clock_skew_tolerance", ingest.DefaultClockSkewTolerance, time.Second, 24*time.Hour,
		"How far a notification's timestamp may be from the bridge's clock when the bridge received it. Nova's "+
			"timestamps order an instance's state and date its vGPU usage, within these bounds: state is never "+
			"ordered by a time later than this after receipt; a usage interval begins and ends no earlier than this "+
			"before receipt and never after it. Raise it when notifications can wait longer in the broker (the "+
			"bridge stopped for an upgrade): a notification that waited longer is accounted from this long before "+
			"it was received. Example: 10m")
	optNotifSSLCA = notificationsOptions.String("notifications", "ssl_ca_file", "",
		"PEM CA bundle to verify RabbitMQ's certificate with (TLS transport URLs: rabbit+ssl:// or ?ssl=1); empty uses "+
			"the system's. Example: /etc/ssl/certs/rabbitmq-ca.pem")
	optNotifSSLCert = notificationsOptions.String("notifications", "ssl_cert_file", "",
		"PEM client certificate for RabbitMQ (mutual TLS). Example: /etc/vgpu-bridge/tls/rabbit.crt")
	optNotifSSLKey = notificationsOptions.String("notifications", "ssl_key_file", "",
		"PEM private key of ssl_cert_file. Example: /etc/vgpu-bridge/tls/rabbit.key")
)

// notificationsOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateNotifications.
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
	if p, b := optNotifPrefetch.Get(v), optNotifBatchSize.Get(v); p < b {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "prefetch", Value: fmt.Sprint(p),
			Problem: fmt.Sprintf("is smaller than batch_size (%d); allowed: at least batch_size", b)})
	}
	if optNotifReconnectMax.Get(v) < optNotifReconnectMin.Get(v) {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "reconnect_max", Value: optNotifReconnectMax.Get(v).String(),
			Problem: "is below reconnect_min"})
	}
	if len(optNotifTopics.Get(v)) == 0 || len(optNotifPriorities.Get(v)) == 0 {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "topics", Problem: "topics and priorities must not be empty"})
	}
	q := optNotifQueue.Get(v)
	for _, k := range notificationKeys(v) {
		if k == q {
			errs = append(errs, &conf.Error{Section: "notifications", Option: "queue", Value: q,
				Problem: "is named like a routing key: that queue is oslo.messaging's own; allowed: a name of the bridge's own, e.g. vgpu-bridge.notifications"})
		}
	}
	if (optNotifSSLCert.Get(v) == "") != (optNotifSSLKey.Get(v) == "") {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "ssl_key_file", Value: optNotifSSLKey.Get(v),
			Problem: "ssl_cert_file and ssl_key_file go together"})
	}
	return errs
}

func notificationKeys(v *conf.Values) []string {
	var keys []string
	for _, t := range optNotifTopics.Get(v) {
		for _, p := range optNotifPriorities.Get(v) {
			keys = append(keys, t+"."+p)
		}
	}
	return keys
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
	tu, err = conf.ParseTransportURL(raw)
	return tu, true, err
}

// NotificationsConfig maps [notifications] and the transport URL to
// ingest.Config (OnApplied is left for the pipeline to set).
func NotificationsConfig(v *conf.Values, tu *conf.TransportURL) (ingest.Config, error) {
	c := ingest.DefaultConfig()
	c.URLs = tu.AMQPURLs()
	c.Exchange = optNotifExchange.Get(v)
	c.ExchangeDurable = optNotifExchangeDurable.Get(v)
	c.ExchangeAutoDelete = optNotifExchangeAutoDelete.Get(v)
	c.ExchangePassive = optNotifExchangePassive.Get(v)
	c.Queue = optNotifQueue.Get(v)
	c.QuorumQueue = optNotifQuorum.Get(v)
	c.BindingKeys = notificationKeys(v)
	c.Prefetch = optNotifPrefetch.Get(v)
	c.BatchSize = optNotifBatchSize.Get(v)
	c.Committers = optNotifCommitters.Get(v)
	c.FlushInterval = optNotifFlushInterval.Get(v)
	c.MaxMessageBytes = optNotifMaxBytes.Get(v)
	c.DeadLetterMaxBytes = optNotifDeadLetterBytes.Get(v)
	c.SilenceWarning = optNotifSilence.Get(v)
	c.ReconnectMin = optNotifReconnectMin.Get(v)
	c.ReconnectMax = optNotifReconnectMax.Get(v)
	c.StallAfter = optNotifStallAfter.Get(v)
	c.ClockSkewTolerance = optNotifClockSkew.Get(v)
	if tu.TLS {
		tc, err := conf.ClientTLS(conf.TLSFiles{CAFile: optNotifSSLCA.Get(v),
			CertFile: optNotifSSLCert.Get(v), KeyFile: optNotifSSLKey.Get(v)})
		if err != nil {
			return c, fmt.Errorf("[notifications] ssl_*: %w", err)
		}
		c.TLS = tc
	}
	return c, nil
}
