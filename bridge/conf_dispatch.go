package bridge

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optDispatchResultsQueue = dispatchOptions.String("dispatch", "results_queue", protocol.ResultsQueue,
		"The bridge's durable queue of agents' results, bound to exchange vgpu with result.#; shared by every replica. "+
			"Example: vgpu.bridge.results")
	optDispatchReportsQueue = dispatchOptions.String("dispatch", "reports_queue", protocol.ReportsQueue,
		"The bridge's durable queue of agents' reports, bound to exchange vgpu with report.#; shared by every replica. "+
			"Example: vgpu.bridge.reports")
	optDispatchQuorum = dispatchOptions.Bool("dispatch", "quorum_queues", false,
		"Declare results_queue and reports_queue as quorum queues (x-queue-type=quorum), for clustered RabbitMQ. "+
			"Example: true")
	optDispatchDeclareAgentQueues = dispatchOptions.Bool("dispatch", "declare_agent_queues", true,
		"Declare vgpu.agent.<host> (as the agent does) before the first command to a host, so that commands wait "+
			"for an agent that is not up yet instead of being dropped as unroutable. Example: false")
	optDispatchRelayInterval = dispatchOptions.Duration("dispatch", "relay_interval", 200*time.Millisecond, 10*time.Millisecond, time.Minute,
		"How often the outbox relay looks for commands to publish when no decision of this replica woke it. Example: 100ms")
	optDispatchRelayBatch = dispatchOptions.Int("dispatch", "relay_batch", 100, 1, 10000,
		"Most commands one relay round publishes (and waits confirms for). Example: 500")
	optDispatchConfirmTimeout = dispatchOptions.Duration("dispatch", "confirm_timeout", 10*time.Second, 100*time.Millisecond, 10*time.Minute,
		"How long the relay waits for RabbitMQ's publisher confirms; unconfirmed commands are published again. Example: 30s")
	optDispatchPrefetch = dispatchOptions.Int("dispatch", "prefetch", 50, 1, 65535,
		"Unacknowledged results (and reports) RabbitMQ may push to this replica. Example: 100")
	optDispatchReconnectMin = dispatchOptions.Duration("dispatch", "reconnect_min", 500*time.Millisecond, 10*time.Millisecond, time.Minute,
		"First wait before reconnecting to RabbitMQ; it doubles (with jitter) up to reconnect_max. Example: 1s")
	optDispatchReconnectMax = dispatchOptions.Duration("dispatch", "reconnect_max", 30*time.Second, 100*time.Millisecond, 10*time.Minute,
		"Longest wait between reconnect attempts. Example: 1m")
)

// dispatchOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateDispatch.
var dispatchOptions = conf.NewGroup().
	SectionHelp("dispatch", "Commands to the agents and their results and reports over RabbitMQ (package agent/protocol): "+
		"exchange vgpu, routing keys agent.<host>, result.<host>, report.<host>. TLS settings are those of [notifications].")

// validateDispatch tests relations between the options of this file.
func validateDispatch(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if optDispatchResultsQueue.Get(v) == optDispatchReportsQueue.Get(v) {
		errs = append(errs, &conf.Error{Section: "dispatch", Option: "reports_queue", Value: optDispatchReportsQueue.Get(v),
			Problem: "equals results_queue; allowed: a queue of its own, e.g. vgpu.bridge.reports"})
	}
	if optDispatchReconnectMax.Get(v) < optDispatchReconnectMin.Get(v) {
		errs = append(errs, &conf.Error{Section: "dispatch", Option: "reconnect_max", Value: optDispatchReconnectMax.Get(v).String(),
			Problem: "is below reconnect_min"})
	}
	return errs
}

// DispatchConfig maps [dispatch] and the transport URL to dispatch.Config
// (TLS is set by the caller from [notifications]).
func DispatchConfig(v *conf.Values, tu *conf.TransportURL, replica string) dispatch.Config {
	c := dispatch.DefaultConfig()
	c.URLs = tu.AMQPURLs()
	c.ResultsQueue = optDispatchResultsQueue.Get(v)
	c.ReportsQueue = optDispatchReportsQueue.Get(v)
	c.QuorumQueues = optDispatchQuorum.Get(v)
	c.DeclareAgentQueues = optDispatchDeclareAgentQueues.Get(v)
	c.RelayInterval = optDispatchRelayInterval.Get(v)
	c.RelayBatch = optDispatchRelayBatch.Get(v)
	c.ConfirmTimeout = optDispatchConfirmTimeout.Get(v)
	c.Prefetch = optDispatchPrefetch.Get(v)
	c.ReconnectMin = optDispatchReconnectMin.Get(v)
	c.ReconnectMax = optDispatchReconnectMax.Get(v)
	c.Replica = replica
	return c
}
