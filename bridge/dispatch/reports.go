package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// HandleReport keeps an agent's report: the hosts row (node name = the
// Placement root provider, versions, last report time, the report), the
// gpus rows of that node learn their compute host, and the profile
// catalog learns the reported vGPU types.
func (x *Dispatcher) HandleReport(ctx context.Context, r protocol.Report) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var errs []byte
	if len(r.Errors) > 0 {
		errs, _ = json.Marshal(r.Errors)
	}
	node := r.Node
	if node == "" {
		node = r.Host
	}
	var pcis []string
	for _, g := range r.GPUs {
		pcis = append(pcis, g.PCI)
	}
	// One statement (its own transaction): the hosts row, the load of
	// the report's vGPUs (loadOf) and the gpus rows of the node.
	l := loadOf(r)
	if pcis == nil {
		pcis = []string{}
	}
	if _, err := x.d.Pool.Exec(ctx, `WITH h AS (
			INSERT INTO hosts AS h (name, node, agent_version, driver_version, last_report_at, report, report_seq, report_errors)
			VALUES ($1, $2, $3, nullif($4,''), now(), $5, $6, $7)
			ON CONFLICT (name) DO UPDATE SET last_report_at = now(), updated_at = now(),
				node = CASE WHEN h.report_seq IS NULL OR EXCLUDED.report_seq >= h.report_seq OR EXCLUDED.report_seq <= 1 THEN EXCLUDED.node ELSE h.node END,
				agent_version = CASE WHEN h.report_seq IS NULL OR EXCLUDED.report_seq >= h.report_seq OR EXCLUDED.report_seq <= 1 THEN EXCLUDED.agent_version ELSE h.agent_version END,
				driver_version = CASE WHEN h.report_seq IS NULL OR EXCLUDED.report_seq >= h.report_seq OR EXCLUDED.report_seq <= 1 THEN EXCLUDED.driver_version ELSE h.driver_version END,
				report = CASE WHEN h.report_seq IS NULL OR EXCLUDED.report_seq >= h.report_seq OR EXCLUDED.report_seq <= 1 THEN EXCLUDED.report ELSE h.report END,
				report_errors = CASE WHEN h.report_seq IS NULL OR EXCLUDED.report_seq >= h.report_seq OR EXCLUDED.report_seq <= 1 THEN EXCLUDED.report_errors ELSE h.report_errors END,
				report_seq = CASE WHEN h.report_seq IS NULL OR EXCLUDED.report_seq >= h.report_seq OR EXCLUDED.report_seq <= 1 THEN EXCLUDED.report_seq ELSE h.report_seq END
		), l AS (
			INSERT INTO instance_load AS l (instance_uuid, host, samples, updated_at)
			SELECT i::uuid, $1, jsonb_build_array(jsonb_build_array(round(extract(epoch FROM now())), u, f, e, d)), now()
			FROM unnest($8::text[], $9::float8[], $10::float8[], $11::float8[], $12::float8[]) AS t(i, u, f, e, d)
			ON CONFLICT (instance_uuid) DO UPDATE SET host = EXCLUDED.host, updated_at = now(),
				samples = coalesce((SELECT jsonb_agg(s) FROM jsonb_array_elements(l.samples) s
					WHERE (s->>0)::float8 > extract(epoch FROM now()) - 7200), '[]'::jsonb) || EXCLUDED.samples
		), g AS (
			UPDATE gpus SET host = $1, updated_at = now()
			WHERE node = $2 AND pci_address = ANY($13) AND host IS DISTINCT FROM $1
		)
		SELECT`,
		r.Host, node, r.AgentVersion, r.DriverVersion, body, int64(r.Seq), errs,
		l.instances, l.utils, l.fbs, l.encs, l.decs, pcis); err != nil {
		return fmt.Errorf("keep report of %s: %w", r.Host, err)
	}
	x.m.reports.Inc()
	if x.d.Faults != nil {
		if err := x.d.Faults(ctx, r.Host, node, r.GPUs); err != nil {
			return fmt.Errorf("GPU faults of %s: %w", r.Host, err)
		}
	}
	if x.d.Catalog != nil {
		for _, g := range r.GPUs {
			for _, t := range g.Types {
				if t.ID == "" || t.Name == "" {
					continue
				}
				if _, err := x.d.Catalog.Observe(t.ID, t.Name, t.MaxInstances); err != nil {
					x.log.Debug("dispatch: reported vGPU type not in the catalog", logkey.Host, r.Host, "type", t.ID, "name", t.Name, logkey.Err, err)
				}
			}
		}
	}
	return nil
}

// reportLoad is the load of a report's vGPUs, one entry per instance,
// as HandleReport appends it to each instance's window in instance_load
// (dropping samples older than two hours): SM, encoder and decoder
// utilisation (their mean when the instance has several vGPUs),
// framebuffer used (their sum); a codec no vGPU of the instance reported
// is null.
type reportLoad struct {
	instances  []string
	utils, fbs []float64
	encs, decs []*float64
}

func loadOf(r protocol.Report) reportLoad {
	type load struct {
		util, fb, enc, dec float64
		n, nEnc, nDec      int
	}
	by := map[string]*load{}
	var order []string
	for _, g := range r.GPUs {
		for _, v := range g.Active {
			if v.UtilPercent == nil || math.IsNaN(*v.UtilPercent) {
				continue
			}
			if _, err := uuid.Parse(v.InstanceUUID); err != nil {
				continue // not in a domain, or not one of Nova's
			}
			l := by[v.InstanceUUID]
			if l == nil {
				l = &load{}
				by[v.InstanceUUID] = l
				order = append(order, v.InstanceUUID)
			}
			l.util += *v.UtilPercent
			if v.FBUsedMiB != nil {
				l.fb += float64(*v.FBUsedMiB)
			}
			if v.EncoderPercent != nil && !math.IsNaN(*v.EncoderPercent) {
				l.enc += *v.EncoderPercent
				l.nEnc++
			}
			if v.DecoderPercent != nil && !math.IsNaN(*v.DecoderPercent) {
				l.dec += *v.DecoderPercent
				l.nDec++
			}
			l.n++
		}
	}
	out := reportLoad{instances: make([]string, len(order)), utils: make([]float64, len(order)), fbs: make([]float64, len(order)),
		encs: make([]*float64, len(order)), decs: make([]*float64, len(order))}
	mean := func(sum float64, n int) *float64 {
		if n == 0 {
			return nil
		}
		v := sum / float64(n)
		return &v
	}
	for i, id := range order {
		l := by[id]
		out.instances[i] = id
		out.utils[i], out.fbs[i], out.encs[i], out.decs[i] = l.util/float64(l.n), l.fb, mean(l.enc, l.nEnc), mean(l.dec, l.nDec)
	}
	return out
}

type metrics struct {
	published  *prometheus.CounterVec
	expired    prometheus.Counter
	reports    prometheus.Counter
	broken     *prometheus.CounterVec
	unsigned   *prometheus.CounterVec
	reconnects prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_dispatch_commands_published_total",
			Help: "Commands published to agents: sent (confirmed by the broker) or failed (retried)."}, []string{"outcome"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_bridge_dispatch_commands_expired_total",
			Help: "Commands that expired before they could be published."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_bridge_dispatch_reports_total",
			Help: "Agent reports kept."}),
		broken: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_dispatch_invalid_messages_total",
			Help: "Results and reports dropped, by reason: invalid (could not be decoded; kept in dead_letters), " +
				"bad_signature, unknown_key, key_expired, unsigned (signature check failed) or foreign_refusal " +
				"(a signature refusal of a command body the bridge did not send)."}, []string{"type", "reason"}),
		unsigned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_dispatch_unsigned_accepted_total",
			Help: "Unsigned results and reports accepted because signed ones are not required (switch-over only)."}, []string{"type"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_bridge_dispatch_reconnects_total",
			Help: "Broker sessions that ended and were retried."}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.expired, m.reports, m.broken, m.unsigned, m.reconnects)
	}
	return m
}
