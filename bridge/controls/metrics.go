package controls

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	paused, observe prometheus.Gauge
	held            *prometheus.CounterVec
	purged          *prometheus.CounterVec
	purgeRuns       *prometheus.CounterVec
	replays         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		paused: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vgpu_bridge_controls_paused",
			Help: "1 while operators paused the pipeline (no decisions, nothing sent to agents), as this replica last read it."}),
		observe: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vgpu_bridge_controls_observe_only",
			Help: "1 while observe-only mode is on (decide and explain, act on nothing), as this replica last read it."}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_controls_held_total",
			Help: "Rounds held back by the operator mode, by part: pipeline (inbox polls while paused), decision (events " +
				"whose decision transaction found the pipeline paused), relay (outbox rounds while paused or observe-only), " +
				"deadlines (deadline checks while paused), nova (Nova-path call rounds while paused)."}, []string{"part"}),
		purged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_purged_rows_total",
			Help: "Rows deleted by the retention purge, by table."}, []string{"table"}),
		purgeRuns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_purge_runs_total",
			Help: "Retention purge rounds, by outcome: done, skipped (another replica held the purge lock), failed."}, []string{"outcome"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_dead_letter_replays_total",
			Help: "Dead-letter replays, by outcome: accepted, duplicate, still_invalid, refused."}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.paused, m.observe, m.held, m.purged, m.purgeRuns, m.replays)
	}
	for _, p := range []string{"pipeline", "decision", "relay", "deadlines", "nova"} {
		m.held.WithLabelValues(p)
	}
	return m
}

func (m *metrics) set(mode Mode) {
	m.paused.Set(b2f(mode.Paused))
	m.observe.Set(b2f(mode.ObserveOnly))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
