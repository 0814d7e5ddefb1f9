package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// CodeRepeatedAlerts is the code of an Alertmanager request every alert
// of which the source had sent before (a re-notification or a retry).
const CodeRepeatedAlerts = "repeated_alerts"

// alertMetrics are the numbers an alert carries, for the policy's
// metrics: its labels and annotations whose value reads as a finite
// number, by name (an annotation wins over a label of the same name),
// renamed as the source's rename map says (alert_metrics). A resolved
// alert carries none: its condition has ended, and a rule's sustained
// condition (for:) ends with it.
func alertMetrics(a Alert, rename map[string]string) map[string]any {
	if a.Status != "firing" {
		return nil
	}
	out := map[string]any{}
	put := func(m map[string]string) {
		for k, v := range m {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				continue
			}
			if to, ok := rename[k]; ok {
				k = to
			}
			out[k] = f
		}
	}
	put(a.Labels)
	put(a.Annotations)
	if len(out) == 0 {
		return nil
	}
	return out
}

// alertKey identifies one alert's state change for a source: its
// fingerprint (or, without one, its sorted labels), status and start.
// Alertmanager sends the same alert again at every repeat_interval and
// after a failed delivery, and a group again whenever an alert joins it:
// each state change acts once.
func alertKey(a Alert) [32]byte {
	h := sha256.New()
	if a.Fingerprint != "" {
		fmt.Fprintf(h, "fp:%s", a.Fingerprint)
	} else {
		keys := make([]string, 0, len(a.Labels))
		for k := range a.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(h, "%s\xff%s\xfe", k, a.Labels[k])
		}
	}
	fmt.Fprintf(h, "\x00%s\x00%s", a.Status, a.StartsAt.UTC().Format("2006-01-02T15:04:05.999999999Z"))
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// claimAlerts claims, for the idempotency TTL, the keys of the alerts of
// the Alertmanager requests among create (taking over expired claims),
// and drops from each request the alerts claimed before, by another
// transaction or an earlier request of create: they are listed as skipped
// with the request that acted on them. A request left without alerts is
// rejected (CodeRepeatedAlerts). It returns the requests whose answer
// changed.
func (e *Endpoint) claimAlerts(ctx context.Context, tx pgx.Tx, create []*pending) ([]*pending, error) {
	type ref struct {
		p *pending
		i int // index in p.events
	}
	var srcs []string
	var keys [][]byte
	var ids [][16]byte
	byKey := map[string]ref{}
	first := map[string]string{} // source + key → request id, within create
	dup := map[*pending]map[int]string{}
	mark := func(p *pending, i int, by string) {
		if dup[p] == nil {
			dup[p] = map[int]string{}
		}
		dup[p][i] = by
	}
	for _, p := range create {
		if p.src.cfg.Format != FormatAlertmanager {
			continue
		}
		for i := range p.events {
			k := alertKey(*p.events[i].payload.Alert)
			sk := p.src.cfg.Name + "\x00" + string(k[:])
			if by, ok := first[sk]; ok {
				mark(p, i, by)
				continue
			}
			first[sk] = p.req.ID.String()
			byKey[sk] = ref{p, i}
			srcs, keys, ids = append(srcs, p.src.cfg.Name), append(keys, k[:]), append(ids, [16]byte(p.req.ID))
		}
	}
	if len(srcs) == 0 && len(dup) == 0 {
		return nil, nil
	}
	if len(srcs) > 0 {
		// ON CONFLICT waits for a concurrent transaction claiming the same
		// alert; a live claim is left alone and not returned.
		rows, err := tx.Query(ctx, `INSERT INTO webhook_alerts (source, alert_key, request_id, expires_at)
			SELECT s, k, id, now() + make_interval(secs => $4)
			FROM unnest($1::text[], $2::bytea[], $3::uuid[]) AS t(s, k, id)
			ON CONFLICT (source, alert_key) DO UPDATE SET request_id = EXCLUDED.request_id, expires_at = EXCLUDED.expires_at, created_at = now()
			WHERE webhook_alerts.expires_at < now()
			RETURNING source, alert_key`, srcs, keys, ids, e.cfg.IdempotencyTTL.Seconds())
		if err != nil {
			return nil, fmt.Errorf("claim alerts: %w", err)
		}
		claimed := map[string]bool{}
		for rows.Next() {
			var s string
			var k []byte
			if err := rows.Scan(&s, &k); err != nil {
				rows.Close()
				return nil, err
			}
			claimed[s+"\x00"+string(k)] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("claim alerts: %w", err)
		}
		var lostSrcs []string
		var lostKeys [][]byte
		for sk, r := range byKey {
			if !claimed[sk] {
				src, k, _ := strings.Cut(sk, "\x00")
				lostSrcs, lostKeys = append(lostSrcs, src), append(lostKeys, []byte(k))
				mark(r.p, r.i, "")
			}
		}
		if len(lostSrcs) > 0 {
			// Name the request that acted on each repeated alert.
			rows, err := tx.Query(ctx, `SELECT w.source, w.alert_key, w.request_id::text FROM webhook_alerts w
				JOIN unnest($1::text[], $2::bytea[]) AS t(s, k) ON w.source = t.s AND w.alert_key = t.k`, lostSrcs, lostKeys)
			if err != nil {
				return nil, fmt.Errorf("repeated alerts: %w", err)
			}
			for rows.Next() {
				var s, by string
				var k []byte
				if err := rows.Scan(&s, &k, &by); err != nil {
					rows.Close()
					return nil, err
				}
				if r, ok := byKey[s+"\x00"+string(k)]; ok {
					dup[r.p][r.i] = by
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, fmt.Errorf("repeated alerts: %w", err)
			}
		}
	}
	var changed []*pending
	for p, idx := range dup {
		var ans Answer
		if err := json.Unmarshal(p.answer, &ans); err != nil {
			return nil, err
		}
		kept := p.events[:0]
		for i, ev := range p.events {
			by, repeated := idx[i]
			if !repeated {
				kept = append(kept, ev)
				continue
			}
			a := ev.payload.Alert
			reason := fmt.Sprintf("a repeat of alert %s (%s since %s), already received", a.Labels["alertname"], a.Status,
				a.StartsAt.UTC().Format("2006-01-02T15:04:05Z"))
			if by != "" {
				reason += " by request " + by
			}
			ans.Skipped = append(ans.Skipped, Skipped{Index: ev.alert, Fingerprint: a.Fingerprint, AlertName: a.Labels["alertname"], Reason: reason})
		}
		p.events = kept
		sort.Slice(ans.Skipped, func(i, j int) bool { return ans.Skipped[i].Index < ans.Skipped[j].Index })
		if len(p.events) == 0 && p.rejectReason == "" {
			p.rejectReason, p.rejectCode = "every alert of the notification was received before (a repeat or a retry of Alertmanager)", CodeRepeatedAlerts
		}
		p.req.InstanceUUID = nil
		if len(p.events) == 1 {
			u := p.events[0].vmUUID
			p.req.InstanceUUID = &u
		}
		b, err := json.Marshal(ans)
		if err != nil {
			return nil, err
		}
		p.answer = b
		changed = append(changed, p)
	}
	return changed, nil
}
