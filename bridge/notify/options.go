package notify

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [oslo_messaging_notifications] options the relay reads,
// declared once with their defaults: the bridge's set takes them from
// Options, and DefaultConfig (the values a zero Config field takes) is
// built from them. The broker (transport_url) is the bridge's.
var options = conf.NewGroup()

var (
	optDriver = options.Choice("oslo_messaging_notifications", "driver", DriverMessagingV2,
		[]string{DriverMessagingV2, DriverNoop},
		"How the bridge's own notifications (vgpu.attach.*, vgpu.detach.*, vgpu.resize.*, vgpu.request.error, vgpu.exists) "+
			"leave: messagingv2 publishes them in oslo.messaging's versioned format; noop discards them. Example: noop")
	optExchange = options.String("oslo_messaging_notifications", "exchange", "vgpu_bridge",
		"The topic exchange the bridge publishes to (oslo.messaging's control_exchange; a listener's Target exchange). "+
			"Example: vgpu_bridge")
	optExchangeDurable = options.Bool("oslo_messaging_notifications", "exchange_durable", false,
		"Declare the exchange (and queues, with declare_queues) durable. Must equal the consumers' "+
			"[oslo_messaging_rabbit] amqp_durable_queues, or the broker refuses with 406 PRECONDITION_FAILED. Example: true").
		Also("oslo_messaging_rabbit", "amqp_durable_queues")
	optTopics = options.List("oslo_messaging_notifications", "topics", "versioned_notifications",
		"Topics the notifications go to; each message is published with routing key TOPIC.PRIORITY "+
			"(versioned_notifications.info, versioned_notifications.error) for every topic. Example: versioned_notifications")
	optDeclareQueues = options.Bool("oslo_messaging_notifications", "declare_queues", false,
		"Declare and bind a queue named after each routing key, as oslo.messaging's notifier does, so notifications wait "+
			"there until a consumer reads them; nobody reading them makes the queues grow. Off: the broker drops what no "+
			"consumer's queue is bound for. Example: true")
	optPoll = options.Duration("oslo_messaging_notifications", "poll_interval", 5*time.Second, 100*time.Millisecond, time.Hour,
		"Longest wait before the relay looks for unsent notifications; a commit that queued some wakes it at once "+
			"(Postgres NOTIFY). Example: 10s")
)

// Options returns the [oslo_messaging_notifications] options declared by
// this package, with their check.
func Options() *conf.Group { return options.WithCheck(check) }

func check(v *conf.Values) conf.Errors {
	if len(optTopics.Get(v)) == 0 {
		return conf.Errors{{Section: "oslo_messaging_notifications", Option: "topics", Problem: "must not be empty"}}
	}
	return nil
}

// ConfigFrom maps [oslo_messaging_notifications] to a Config; the
// brokers, TLS, publisher id, reconnect bounds and Replica are the
// caller's. BatchSize and ConfirmTimeout, which no option sets, are fixed
// here.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		Driver:          optDriver.Get(v),
		Exchange:        optExchange.Get(v),
		ExchangeDurable: optExchangeDurable.Get(v),
		Topics:          optTopics.Get(v),
		DeclareQueues:   optDeclareQueues.Get(v),
		BatchSize:       500,
		Poll:            optPoll.Get(v),
		ConfirmTimeout:  10 * time.Second,
	}
}

var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })

// DefaultConfig returns the defaults of the [oslo_messaging_notifications]
// options: the values a zero BatchSize, Poll or ConfirmTimeout takes.
func DefaultConfig() Config { return defaults() }
