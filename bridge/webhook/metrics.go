package webhook

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	refused   *prometheus.CounterVec
	accepted  *prometheus.CounterVec
	replayed  *prometheus.CounterVec
	callbacks *prometheus.CounterVec
	batchSize prometheus.Histogram
	commitDur prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_bridge_webhook_refused_total",
			Help: "Webhooks refused, by source ((unknown) for unknown names) and reason (the problem's code).",
		}, []string{"source", "reason"}),
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_bridge_webhook_accepted_total",
			Help: "Webhooks committed and answered 202, by source.",
		}, []string{"source"}),
		replayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_bridge_webhook_replayed_total",
			Help: "Retries answered with the first answer of their idempotency key, by source.",
		}, []string{"source"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_bridge_webhook_callback_attempts_total",
			Help: "Callback attempts by source and outcome (delivered, retry, failed, refused).",
		}, []string{"source", "outcome"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vgpu_bridge_webhook_commit_batch_size",
			Help:    "Webhooks committed per transaction (group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
		commitDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vgpu_bridge_webhook_commit_duration_seconds",
			Help:    "Duration of one group-commit transaction.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	reg.MustRegister(m.refused, m.accepted, m.replayed, m.callbacks, m.batchSize, m.commitDur)
	return m
}
