package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// The load loop closes without an outside monitor: agents report each
// vGPU's load (dispatch keeps a window per instance in instance_load), and
// every LoadInterval one replica turns each instance's window into a
// bridge.vgpu_load event in the inbox. The policy's load rules then run
// on it like on a webhook's GPU_LOAD, with their sustained conditions
// (for:), hysteresis and cooldown kept in Postgres across evaluations.

// EventVGPULoad is the type of the load event; KindVGPULoad its kind.
const (
	EventVGPULoad = "vgpu_load"
	KindVGPULoad  = BridgeKindPrefix + EventVGPULoad
)

// Load is the payload of a load event: the instance's load over the
// window, as the policy's metrics.
type Load struct {
	Host    string             `json:"host"`
	Metrics map[string]float64 `json:"metrics"`
}

// loadSample is one [unix seconds, SM util %, framebuffer MiB, encoder
// util %, decoder util %] of a window; what a report did not carry is NaN
// (null in instance_load, or absent in samples kept before the codecs
// were reported).
type loadSample [5]float64

// UnmarshalJSON reads a sample of up to five numbers or nulls.
func (s *loadSample) UnmarshalJSON(b []byte) error {
	var v []*float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	for i := range s {
		s[i] = math.NaN()
		if i < len(v) && v[i] != nil {
			s[i] = *v[i]
		}
	}
	return nil
}

// LoadMetrics summarises a window of samples (oldest first) ending at
// now: gpu_util (the latest sample), gpu_util_avg, gpu_util_min and
// gpu_util_max over the last window, fb_used_mib (latest), enc_util and
// dec_util (latest) with enc_util_avg and dec_util_avg when the reports
// carry the video engines, and load_samples and load_span_s (how much of
// the window the samples cover). ok is false when no sample is in the
// window. It is pure.
func LoadMetrics(samples []loadSample, now time.Time, window time.Duration) (map[string]float64, bool) {
	from := float64(now.Add(-window).Unix())
	var n, nEnc, nDec int
	var sum, lo, hi, first, sumEnc, sumDec float64
	var last loadSample
	for _, s := range samples {
		if s[0] < from || math.IsNaN(s[1]) {
			continue
		}
		if n == 0 {
			lo, hi, first = s[1], s[1], s[0]
		}
		n++
		sum += s[1]
		lo, hi = math.Min(lo, s[1]), math.Max(hi, s[1])
		if !math.IsNaN(s[3]) {
			nEnc++
			sumEnc += s[3]
		}
		if !math.IsNaN(s[4]) {
			nDec++
			sumDec += s[4]
		}
		last = s
	}
	if n == 0 {
		return nil, false
	}
	m := map[string]float64{
		"gpu_util": last[1], "gpu_util_avg": sum / float64(n), "gpu_util_min": lo, "gpu_util_max": hi,
		"load_samples": float64(n), "load_span_s": last[0] - first,
	}
	if !math.IsNaN(last[2]) {
		m["fb_used_mib"] = last[2]
	}
	if !math.IsNaN(last[3]) {
		m["enc_util"], m["enc_util_avg"] = last[3], sumEnc/float64(nEnc)
	}
	if !math.IsNaN(last[4]) {
		m["dec_util"], m["dec_util_avg"] = last[4], sumDec/float64(nDec)
	}
	return m, true
}

// runLoad evaluates the instances' load every LoadInterval until ctx ends.
func (p *Processor) runLoad(ctx context.Context) {
	wake.Every(ctx, p.cfg.LoadInterval, func(ctx context.Context) {
		n, err := p.LoadOnce(ctx)
		if err != nil && ctx.Err() == nil {
			p.log.Warn("pipeline: load evaluation failed", logkey.Err, err)
		} else if n > 0 {
			p.Wake()
		}
	})
}

// LoadOnce writes a bridge.vgpu_load event for each instance whose window
// has samples, once per interval (message id vgpu_load:<instance>:<the
// interval's start>), and forgets windows no report refreshed for two
// hours. One replica at a time does it (the others skip); it returns how
// many events it wrote.
func (p *Processor) LoadOnce(ctx context.Context) (int, error) {
	now := time.Now()
	interval := p.cfg.LoadInterval
	if interval <= 0 {
		interval = DefaultConfig().LoadInterval
	}
	bucket := now.Truncate(interval).Unix()
	written := 0
	err := pgx.BeginFunc(ctx, p.d.Pool, func(tx pgx.Tx) error {
		var lead bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('vgpu-bridge/load', 0))`).Scan(&lead); err != nil || !lead {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM instance_load WHERE updated_at < now() - interval '2 hours'`); err != nil {
			return fmt.Errorf("forget old load windows: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT l.instance_uuid::text, l.host, l.samples, coalesce(i.project_id, '') FROM instance_load l
			LEFT JOIN instances i ON i.uuid = l.instance_uuid
			WHERE l.updated_at > now() - make_interval(secs => $1)`, p.cfg.LoadWindow.Seconds())
		if err != nil {
			return fmt.Errorf("read load windows: %w", err)
		}
		var ids, msgs, payloads, projects []string
		for rows.Next() {
			var id, host, project string
			var raw []byte
			if err := rows.Scan(&id, &host, &raw, &project); err != nil {
				rows.Close()
				return err
			}
			var samples []loadSample
			if json.Unmarshal(raw, &samples) != nil {
				continue
			}
			m, ok := LoadMetrics(samples, now, p.cfg.LoadWindow)
			if !ok {
				continue
			}
			b, _ := json.Marshal(Load{Host: host, Metrics: m})
			ids, msgs, payloads = append(ids, id), append(msgs, fmt.Sprintf("%s:%s:%d", EventVGPULoad, id, bucket)), append(payloads, string(b))
			projects = append(projects, project)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		n, err := requests.QueueLoadEvents(ctx, tx, requests.LoadEvents{Source: BridgeSource, Type: EventVGPULoad,
			Instances: ids, MessageIDs: msgs, Payloads: payloads, ProjectIDs: projects})
		if err != nil {
			return fmt.Errorf("write load events: %w", err)
		}
		written = int(n)
		return nil
	})
	return written, err
}

// mapLoadEvent maps a load event: kind bridge.vgpu_load, its metrics, and
// labels.host.
func mapLoadEvent(r InboxRow, ev policy.Event) (policy.Event, error) {
	var l Load
	if err := json.Unmarshal(r.Payload, &l); err != nil {
		return ev, fmt.Errorf("event %d: load event payload: %w", r.ID, err)
	}
	ev.Kind, ev.Source, ev.Metrics = KindVGPULoad, BridgeSource, l.Metrics
	ev.Labels = map[string]string{"host": l.Host}
	return ev, nil
}
