package drift

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	open    *prometheus.GaugeVec
	found   *prometheus.CounterVec
	runs    *prometheus.CounterVec
	repairs *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vgpu_bridge_drift_findings",
			Help: "Open drift findings by kind: orphan_mdev, missing_device, stale_claim, unclaimed_device, unknown_instance."}, []string{"kind"}),
		found: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_drift_findings_new_total",
			Help: "Drift findings seen for the first time, by kind."}, []string{"kind"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_drift_runs_total",
			Help: "Drift reconciler runs by outcome: ok, error, busy (another replica was running it)."}, []string{"outcome"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_drift_repairs_total",
			Help: "Drift repairs by finding kind and outcome: queued (remove_mdev sent through the outbox), succeeded, failed."}, []string{"kind", "outcome"}),
	}
	for _, k := range Kinds {
		m.open.WithLabelValues(string(k))
	}
	if reg != nil {
		reg.MustRegister(m.open, m.found, m.runs, m.repairs)
	}
	return m
}
