package ingest

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	received, applied, duplicates, stale, unrecognized prometheus.Counter
	dead                                               *prometheus.CounterVec
	commitSeconds                                      prometheus.Histogram
	commitErrors, reconnects, dropped                  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, sinceLast, connected func() float64) *metrics {
	const ns = "vgpu_bridge_notifications_"
	m := &metrics{
		received:     prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "received_total", Help: "Nova notifications delivered by RabbitMQ (redeliveries included)."}),
		applied:      prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "applied_total", Help: "New notifications committed to the inbox."}),
		duplicates:   prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "duplicates_total", Help: "Notifications whose message_id was already in the inbox, or dead letters already kept (see dead_letters_total)."}),
		stale:        prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "stale_total", Help: "New notifications older than the state already held (recorded, state unchanged)."}),
		unrecognized: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "unrecognized_total", Help: "Notifications of an unknown event type or payload major version (recorded, not applied)."}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "dead_letters_total",
			Help: "Notifications stored as dead letters, by reason (not_json, broken_envelope, oversize, no_message_id, schema)."}, []string{"reason"}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: ns + "batch_commit_seconds",
			Help: "Time to commit one batch to Postgres.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		commitErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "commit_errors_total", Help: "Commits (of a batch or of one message) that failed; each is retried or its message dead-lettered."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "dropped_total",
			Help: "Notifications Postgres refused even as a minimal dead letter: acknowledged and dropped (logged with their message_id)."}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "reconnects_total", Help: "Consumer sessions that ended and were restarted."}),
	}
	for _, r := range []string{ReasonNotJSON, ReasonBrokenEnvelope, ReasonOversize, ReasonNoMessageID, ReasonSchema} {
		m.dead.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.received, m.applied, m.duplicates, m.stale, m.unrecognized, m.dead, m.commitSeconds,
			m.commitErrors, m.reconnects, m.dropped,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ns + "seconds_since_last",
				Help: "Seconds since the last notification arrived (since start when none has)."}, sinceLast),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ns + "connected",
				Help: "1 while the consumer is connected and consuming."}, connected))
	}
	return m
}

func (m *metrics) observe(r batchResult, d time.Duration) {
	m.commitSeconds.Observe(d.Seconds())
	m.applied.Add(float64(r.applied))
	m.duplicates.Add(float64(r.duplicates))
	m.stale.Add(float64(r.stale))
	m.unrecognized.Add(float64(r.unrecognized))
	for k, v := range r.dead {
		m.dead.WithLabelValues(k).Add(float64(v))
	}
}
