package ingest

import (
	"fmt"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [notifications] options of the consumer, declared once
// with their defaults: the bridge's set takes them from Options, and
// DefaultConfig is built from them. The broker's address and TLS files,
// also in [notifications], are the bridge's.
var options = conf.NewGroup()

var (
	optQueue = options.String("notifications", "queue", "vgpu-bridge.notifications",
		"The bridge's own durable queue, bound to Nova's notification topics. All replicas share it. "+
			"Never name it like a routing key (versioned_notifications.info): that queue is oslo.messaging's own. "+
			"Example: vgpu-bridge.notifications")
	optQuorumQueue = options.Bool("notifications", "quorum_queue", false,
		"Declare the queue as a quorum queue (x-queue-type=quorum), for clustered RabbitMQ. An existing queue "+
			"of the other type gives a 406 error naming this option. Example: true").
		Also("oslo_messaging_rabbit", "rabbit_quorum_queue")
	optExchange = options.String("notifications", "exchange", "nova",
		"oslo.messaging's control exchange Nova publishes to (a topic exchange). Example: nova")
	optExchangeDurable = options.Bool("notifications", "exchange_durable", false,
		"Declare the exchange durable. Must equal Nova's [oslo_messaging_rabbit] amqp_durable_queues, or the broker "+
			"refuses with 406 PRECONDITION_FAILED. Example: true").
		Also("oslo_messaging_rabbit", "amqp_durable_queues")
	optExchangeAutoDelete = options.Bool("notifications", "exchange_auto_delete", false,
		"Declare the exchange auto-delete. Must equal Nova's [oslo_messaging_rabbit] amqp_auto_delete. Example: false").
		Also("oslo_messaging_rabbit", "amqp_auto_delete")
	optExchangePassive = options.Bool("notifications", "exchange_passive", false,
		"Only check that the exchange exists (passive declare) instead of declaring it; for accounts "+
			"without configure permission on it. Example: true")
	optTopics = options.List("notifications", "topics", "versioned_notifications",
		"Nova's versioned notification topics ([notifications] versioned_notifications_topics in nova.conf). "+
			"Each is bound as TOPIC.PRIORITY for every priority. Example: versioned_notifications").
		Also("notifications", "versioned_notifications_topics")
	optPriorities = options.List("notifications", "priorities", "info,error",
		"Notification priorities to consume (routing key suffixes). Nova sends versioned notifications as info and error. "+
			"Example: info,error")
	optPrefetch = options.Int("notifications", "prefetch", 1000, 1, 65535,
		"Unacknowledged messages RabbitMQ may push to this replica (AMQP QoS). At least batch_size. Example: 1000")
	optBatchSize = options.Int("notifications", "batch_size", 250, 1, 10000,
		"Most notifications committed in one Postgres transaction (and acknowledged together after it). Example: 250")
	optCommitters = options.Int("notifications", "committers", 2, 1, 16,
		"Batches committed concurrently (each in its own transaction); acknowledgements stay in delivery order. "+
			"prefetch should cover (committers + 2) * batch_size. Example: 2")
	optFlushInterval = options.Duration("notifications", "flush_interval", 20*time.Millisecond, time.Millisecond, 10*time.Second,
		"Longest a partial batch waits before it is committed. Example: 50ms")
	optMaxMessageBytes = options.Int("notifications", "max_message_bytes", 1<<20, 1<<10, 64<<20,
		"Bigger messages are dead letters (reason oversize). Example: 1048576")
	optDeadLetterMaxBytes = options.Int("notifications", "dead_letter_max_bytes", 64<<10, 256, 16<<20,
		"How much of a dead letter's raw body is kept. Example: 65536")
	optSilenceWarning = options.Duration("notifications", "silence_warning", 15*time.Minute, 0, 7*24*time.Hour,
		"Log a hint naming Nova's notification settings when no notification arrived for this long; 0 disables. "+
			"Example: 30m")
	optReconnectMin = options.Duration("notifications", "reconnect_min", amqpconn.DefaultBackoff.Min, 10*time.Millisecond, time.Minute,
		"First wait before reconnecting to RabbitMQ; it doubles (with jitter) up to reconnect_max. Example: 1s")
	optReconnectMax = options.Duration("notifications", "reconnect_max", amqpconn.DefaultBackoff.Max, 100*time.Millisecond, 10*time.Minute,
		"Longest wait between reconnect attempts. Example: 1m")
	optStallAfter = options.Duration("notifications", "stall_after", 30*time.Second, time.Second, time.Hour,
		"When commits of notifications to Postgres have failed for this long with none succeeding, /readyz fails "+
			"naming the error (the messages wait unacknowledged on the broker). Example: 1m")
	optClockSkewTolerance = options.Duration("notifications", "clock_skew_tolerance", 5*time.Minute, time.Second, 24*time.Hour,
		"How far a notification's timestamp may be from the bridge's clock when the bridge received it. Nova's "+
			"timestamps order an instance's state and date its vGPU usage, within these bounds: state is never "+
			"ordered by a time later than this after receipt; a usage interval begins and ends no earlier than this "+
			"before receipt and never after it. Raise it when notifications can wait longer in the broker (the "+
			"bridge stopped for an upgrade): a notification that waited longer is accounted from this long before "+
			"it was received. Example: 10m")
)

// Options returns the consumer's [notifications] options with their check.
func Options() *conf.Group { return options.WithCheck(check) }

// check tests relations between the consumer's options.
func check(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if p, b := optPrefetch.Get(v), optBatchSize.Get(v); p < b {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "prefetch", Value: fmt.Sprint(p),
			Problem: fmt.Sprintf("is smaller than batch_size (%d); allowed: at least batch_size", b)})
	}
	if optReconnectMax.Get(v) < optReconnectMin.Get(v) {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "reconnect_max", Value: optReconnectMax.Get(v).String(),
			Problem: "is below reconnect_min"})
	}
	if len(optTopics.Get(v)) == 0 || len(optPriorities.Get(v)) == 0 {
		errs = append(errs, &conf.Error{Section: "notifications", Option: "topics", Problem: "topics and priorities must not be empty"})
	}
	q := optQueue.Get(v)
	for _, k := range bindingKeys(v) {
		if k == q {
			errs = append(errs, &conf.Error{Section: "notifications", Option: "queue", Value: q,
				Problem: "is named like a routing key: that queue is oslo.messaging's own; allowed: a name of the bridge's own, e.g. vgpu-bridge.notifications"})
		}
	}
	return errs
}

// bindingKeys are topics x priorities.
func bindingKeys(v *conf.Values) []string {
	var keys []string
	for _, t := range optTopics.Get(v) {
		for _, p := range optPriorities.Get(v) {
			keys = append(keys, t+"."+p)
		}
	}
	return keys
}

// ConfigFrom maps the consumer's [notifications] options to a Config;
// the broker's URLs and TLS, and OnApplied, are the caller's. The fields
// no option sets keep DefaultConfig's values.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		Source:             "nova",
		Exchange:           optExchange.Get(v),
		ExchangeDurable:    optExchangeDurable.Get(v),
		ExchangeAutoDelete: optExchangeAutoDelete.Get(v),
		ExchangePassive:    optExchangePassive.Get(v),
		Queue:              optQueue.Get(v),
		QuorumQueue:        optQuorumQueue.Get(v),
		BindingKeys:        bindingKeys(v),
		Prefetch:           optPrefetch.Get(v),
		BatchSize:          optBatchSize.Get(v),
		Committers:         optCommitters.Get(v),
		FlushInterval:      optFlushInterval.Get(v),
		MaxMessageBytes:    optMaxMessageBytes.Get(v),
		DeadLetterMaxBytes: optDeadLetterMaxBytes.Get(v),
		SilenceWarning:     optSilenceWarning.Get(v),
		ReconnectMin:       optReconnectMin.Get(v),
		ReconnectMax:       optReconnectMax.Get(v),
		ConnectionName:     "vgpu-bridge notifications",
		ShutdownGrace:      10 * time.Second,
		StallAfter:         optStallAfter.Get(v),
		ClockSkewTolerance: optClockSkewTolerance.Get(v),
	}
}

// DefaultConfig returns the defaults: the options' declared defaults, and
// those of the fields no option sets.
func DefaultConfig() Config { return ConfigFrom(conf.Defaults(options)) }
