package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
)

type metrics struct {
	events        *prometheus.CounterVec
	decide        prometheus.Histogram
	claims        prometheus.Counter
	results       *prometheus.CounterVec
	requests      *prometheus.CounterVec
	compensations *prometheus.CounterVec
	quotaRetries  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_pipeline_events_total",
			Help: "Inbox events processed by outcome: act, reject, fail, nothing, defer (held back by a cooldown or for: window, evaluated again when it ends), skipped (request already final), error (retried)."}, []string{"outcome"}),
		decide: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vgpu_bridge_pipeline_decide_seconds",
			Help:    "Time to process one inbox event: policy, Placement claim and the decision's transaction.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_bridge_pipeline_claims_total",
			Help: "vGPUs claimed in Placement on the direct path."}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_pipeline_results_total",
			Help: "Agent results recorded, by command kind and status."}, []string{"kind", "status"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_pipeline_requests_finished_total",
			Help: "Requests the pipeline finished after dispatching, by final state."}, []string{"state"}),
		compensations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_pipeline_compensations_total",
			Help: "Compensation steps: claim_released, mdev_removal_queued, vgpu_restored (a failed profile change brings the old vGPU back), restore_failed (it could not), resize_reverted (Nova path)."}, []string{"step"}),
		quotaRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_bridge_pipeline_quota_retries_total",
			Help: "Decisions taken again, locking their project's usage first, because that usage changed between their read and the lock."}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.decide, m.claims, m.results, m.requests, m.compensations, m.quotaRetries)
	}
	return m
}

// Counters are the pipeline's metrics that the paths acting for it
// (package direct, package novaresize) count in too: one set of series
// whichever package took the step.
type Counters struct{ m *metrics }

// Compensated counts a compensation step (claim_released,
// mdev_removal_queued, vgpu_restored, restore_failed, resize_reverted).
func (c Counters) Compensated(step string) { c.m.compensations.WithLabelValues(step).Inc() }

// Finished counts a request the pipeline finished after dispatching it.
func (c Counters) Finished(state requests.State) { c.m.requests.WithLabelValues(string(state)).Inc() }

// Decided counts an inbox event decided with outcome, among them one a
// path wrote already processed (nothing listens to it).
func (c Counters) Decided(outcome flow.Outcome) { c.m.events.WithLabelValues(string(outcome)).Inc() }

// Skipped counts an inbox event skipped: its request is final already.
func (c Counters) Skipped() { c.m.events.WithLabelValues("skipped").Inc() }

// Claimed counts vGPUs claimed in Placement on the direct path.
func (c Counters) Claimed(n int) { c.m.claims.Add(float64(n)) }
