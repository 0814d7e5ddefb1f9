package dispatch

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [dispatch] options, declared once with their defaults:
// the bridge's set takes them from Options, and DefaultConfig is built
// from them.
var options = conf.NewGroup().
	SectionHelp("dispatch", "Commands to the agents and their results and reports over RabbitMQ (package agent/protocol): "+
		"exchange vgpu, routing keys agent.<host>, result.<host>, report.<host>. TLS settings are those of [notifications].")

var (
	optResultsQueue = options.String("dispatch", "results_queue", protocol.ResultsQueue,
		"The bridge's durable queue of agents' results, bound to exchange vgpu with result.#; shared by every replica. "+
			"Example: vgpu.bridge.results")
	optReportsQueue = options.String("dispatch", "reports_queue", protocol.ReportsQueue,
		"The bridge's durable queue of agents' reports, bound to exchange vgpu with report.#; shared by every replica. "+
			"Example: vgpu.bridge.reports")
	optQuorumQueues = options.Bool("dispatch", "quorum_queues", false,
		"Declare results_queue and reports_queue as quorum queues (x-queue-type=quorum), for clustered RabbitMQ. "+
			"Example: true").
		Also("oslo_messaging_rabbit", "rabbit_quorum_queue")
	optDeclareAgentQueues = options.Bool("dispatch", "declare_agent_queues", true,
		"Declare vgpu.agent.<host> (as the agent does) before the first command to a host, so that commands wait "+
			"for an agent that is not up yet instead of being dropped as unroutable. Example: false")
	optRelayInterval = options.Duration("dispatch", "relay_interval", 200*time.Millisecond, 10*time.Millisecond, time.Minute,
		"How often the outbox relay looks for commands to publish when no decision of this replica woke it. Example: 100ms")
	optRelayBatch = options.Int("dispatch", "relay_batch", 100, 1, 10000,
		"Most commands one relay round publishes (and waits confirms for). Example: 500")
	optConfirmTimeout = options.Duration("dispatch", "confirm_timeout", 10*time.Second, 100*time.Millisecond, 10*time.Minute,
		"How long the relay waits for RabbitMQ's publisher confirms; unconfirmed commands are published again. Example: 30s")
	optPrefetch = options.Int("dispatch", "prefetch", 50, 1, 65535,
		"Unacknowledged results (and reports) RabbitMQ may push to this replica. Example: 100")
	optReconnectMin = options.Duration("dispatch", "reconnect_min", amqpconn.DefaultBackoff.Min, 10*time.Millisecond, time.Minute,
		"First wait before reconnecting to RabbitMQ; it doubles (with jitter) up to reconnect_max. Example: 1s")
	optReconnectMax = options.Duration("dispatch", "reconnect_max", amqpconn.DefaultBackoff.Max, 100*time.Millisecond, 10*time.Minute,
		"Longest wait between reconnect attempts. Example: 1m")
)

// Options returns the options with their check.
func Options() *conf.Group { return options.WithCheck(check) }

// check tests relations between the options.
func check(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if optResultsQueue.Get(v) == optReportsQueue.Get(v) {
		errs = append(errs, &conf.Error{Section: "dispatch", Option: "reports_queue", Value: optReportsQueue.Get(v),
			Problem: "equals results_queue; allowed: a queue of its own, e.g. vgpu.bridge.reports"})
	}
	if optReconnectMax.Get(v) < optReconnectMin.Get(v) {
		errs = append(errs, &conf.Error{Section: "dispatch", Option: "reconnect_max", Value: optReconnectMax.Get(v).String(),
			Problem: "is below reconnect_min"})
	}
	return errs
}

// ConfigFrom maps [dispatch] to a Config; the broker's URLs, TLS and
// Replica are the caller's. The fields no option sets (the exchange, the
// queues' bindings, the connection's name) are DefaultConfig's.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		Exchange:           protocol.Exchange,
		ResultsQueue:       optResultsQueue.Get(v),
		ReportsQueue:       optReportsQueue.Get(v),
		ResultsBindings:    []string{protocol.ResultsBind},
		ReportsBindings:    []string{protocol.ReportsBind},
		QuorumQueues:       optQuorumQueues.Get(v),
		DeclareAgentQueues: optDeclareAgentQueues.Get(v),
		RelayInterval:      optRelayInterval.Get(v),
		RelayBatch:         optRelayBatch.Get(v),
		ConfirmTimeout:     optConfirmTimeout.Get(v),
		Prefetch:           optPrefetch.Get(v),
		ReconnectMin:       optReconnectMin.Get(v),
		ReconnectMax:       optReconnectMax.Get(v),
		ConnectionName:     "vgpu-bridge dispatch",
	}
}

// DefaultConfig returns the defaults of the [dispatch] options.
func DefaultConfig() Config { return ConfigFrom(conf.Defaults(options)) }
