package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook/webhookwire"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// Event types of the native body.
const (
	TypeRequest = "GPU_REQUEST"
	TypeRelease = "GPU_RELEASE"
	TypeResize  = "GPU_RESIZE"
	TypeLoad    = "GPU_LOAD"
)

// Types lists the native event types.
var Types = []string{TypeRequest, TypeRelease, TypeResize, TypeLoad}

// Workloads lists the workload classes.
var Workloads = []string{"training", "inference", "rendering", "vdi", "gaming"}

// Limits of the native body. MaxCount, the vGPUs one request may ask
// for, is the bound a flavor's vGPUs have too (nova.MaxVGPUsPerInstance).
const (
	MaxCount      = nova.MaxVGPUsPerInstance
	maxMetrics    = 64
	maxMetricKey  = 128
	maxMetricText = 1024
	maxURL        = 2048
	maxNonce      = 128
)

var profileRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Native is the native webhook body.
type Native struct {
	Type        string         `json:"type"`
	VMID        string         `json:"vm_id"`
	Workload    string         `json:"workload,omitempty"`
	VGPUProfile string         `json:"vgpu_profile,omitempty"`
	Count       int            `json:"count"`
	Metrics     map[string]any `json:"metrics,omitempty"`
	CallbackURL string         `json:"callback_url,omitempty"`
	// GuestDriver is the NVIDIA driver version the VM's guest runs (or
	// will), e.g. 550.54.15: hosts whose vGPU manager cannot serve it are
	// not chosen.
	GuestDriver string `json:"guest_driver,omitempty"`
	// Tune is the tuning the sender asks for the VM's GPUs: applied only
	// when the VM's project is alone on them and no operator rule sets
	// otherwise (the policy and the bridge decide).
	Tune *requests.WebhookTune `json:"tune,omitempty"`
	// Timestamp, when the sender sets it, is when it signed the body: a
	// body older than the source's timestamp tolerance is refused.
	Timestamp time.Time `json:"timestamp,omitzero"`
	// Nonce is anything the sender puts in to make an identical request
	// a new body (a signed body acts at most once).
	Nonce string `json:"nonce,omitempty"`
	// EventID is the sender's own id of the event (1 to 255 printable
	// ASCII characters): the request's idempotency key when it sends no
	// Idempotency-Key (or webhook-id, X-GitHub-Delivery), so a sender
	// that retries without a key is not doubled.
	EventID string `json:"event_id,omitempty"`
}

// driverRE is an NVIDIA driver version: 550, 550.54 or 550.54.15.
var driverRE = regexp.MustCompile(`^[0-9]{1,4}(\.[0-9]{1,4}){0,3}$`)

func oneOf(v string, set []string) bool {
	for _, s := range set {
		if v == s {
			return true
		}
	}
	return false
}

// jsonKind names the JSON type of a raw value for error messages.
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// jsonString returns the string a valid JSON value holds; false when it
// is not a string. Plain ASCII without escapes is sliced, not decoded.
func jsonString(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	plain := true
	for _, c := range raw[1 : len(raw)-1] {
		if c == '\\' || c == '"' || c < 0x20 || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// scalar decodes a valid JSON value as a json.Decoder with UseNumber
// would for a number, a string or a boolean; nil for anything else.
func scalar(raw json.RawMessage) any {
	raw = bytes.TrimSpace(raw)
	switch jsonKind(raw) {
	case "a number":
		return json.Number(raw)
	case "a boolean":
		return raw[0] == 't'
	case "a string":
		if s, ok := jsonString(raw); ok {
			return s
		}
	}
	return nil
}

// strictUUID parses the 36-character canonical form only.
func strictUUID(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.Nil, false
	}
	u, err := uuid.Parse(s)
	return u, err == nil
}

// DecodeNative decodes and validates a native body. allowHost says
// whether a callback host is on the source's allowlist. It returns every
// invalid field; the body must already be valid JSON.
func DecodeNative(body []byte, allowHost func(string) bool) (Native, []api.InvalidParam) {
	var n Native
	var bad []api.InvalidParam
	add := func(name, format string, args ...any) {
		bad = append(bad, api.InvalidParam{Name: name, Reason: fmt.Sprintf(format, args...)})
	}
	fields, ok := objectFields(body)
	if !ok {
		if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
			add("(body)", "must be a JSON object")
			return n, bad
		}
	}
	str := func(name string) (string, bool) {
		raw, ok := fields[name]
		if !ok {
			return "", false
		}
		s, ok := jsonString(raw)
		if !ok {
			add(name, "must be a string, not %s", jsonKind(raw))
			return "", false
		}
		return s, true
	}
	known := func(k string) bool {
		switch k {
		case "type", "vm_id", "workload", "vgpu_profile", "count", "metrics", "callback_url", "timestamp", "nonce", "guest_driver", "event_id", "tune":
			return true
		}
		return false
	}
	var unknown []string
	for k := range fields {
		if !known(k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		add(k, "unknown field")
	}

	if s, ok := str("type"); ok {
		if !oneOf(s, Types) {
			add("type", "must be one of %s", strings.Join(Types, ", "))
		}
		n.Type = s
	} else if _, present := fields["type"]; !present {
		add("type", "is required")
	}

	if s, ok := str("vm_id"); ok {
		if u, ok := strictUUID(s); ok {
			n.VMID = u.String()
		} else {
			add("vm_id", "must be a Nova server UUID like 8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e")
		}
	} else if _, present := fields["vm_id"]; !present {
		add("vm_id", "is required")
	}

	if s, ok := str("workload"); ok {
		if !oneOf(s, Workloads) {
			add("workload", "must be one of %s", strings.Join(Workloads, ", "))
		}
		n.Workload = s
	} else if _, present := fields["workload"]; !present && (n.Type == TypeRequest || n.Type == TypeResize) {
		add("workload", "is required for %s", n.Type)
	}

	if s, ok := str("vgpu_profile"); ok {
		if !profileRE.MatchString(s) {
			add("vgpu_profile", "must be a vGPU profile name such as T4-4Q (letters, digits, '.', '_', '-'; at most 64)")
		}
		n.VGPUProfile = s
	}

	if s, ok := str("guest_driver"); ok {
		if !driverRE.MatchString(s) {
			add("guest_driver", "must be an NVIDIA driver version such as 550.54.15 (digits and dots)")
		}
		n.GuestDriver = s
	}

	n.Count = 1
	if raw, ok := fields["count"]; ok {
		// raw is a valid JSON value: a number is its own literal.
		c := json.Number(bytes.TrimSpace(raw))
		if jsonKind(raw) != "a number" {
			add("count", "must be an integer, not %s", jsonKind(raw))
		} else if i, err := c.Int64(); err != nil || i < 1 || i > MaxCount {
			add("count", "must be an integer from 1 to %d", MaxCount)
		} else {
			n.Count = int(i)
		}
	}

	if raw, ok := fields["metrics"]; ok {
		m, ok := objectFields(raw)
		if !ok && (json.Unmarshal(raw, &m) != nil || m == nil) {
			add("metrics", "must be an object, not %s", jsonKind(raw))
		} else if len(m) > maxMetrics {
			add("metrics", "may hold at most %d entries", maxMetrics)
		} else {
			n.Metrics = make(map[string]any, len(m))
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				name := func() string { return "metrics." + k } // only for a refusal
				if k == "" || len(k) > maxMetricKey {
					add(name(), "names must be 1 to %d characters", maxMetricKey)
					continue
				}
				switch x := scalar(m[k]).(type) {
				case json.Number:
					// Finite in float64 (what the policy computes with) and
					// so in Postgres's numeric too.
					f, err := strconv.ParseFloat(string(x), 64)
					mant, _, _ := strings.Cut(strings.ToLower(string(x)), "e")
					if err != nil || math.IsInf(f, 0) || (f == 0 && strings.ContainsAny(mant, "123456789")) { // over, or under to 0
						add(name(), "must be a number a double can hold (0, or a magnitude from about 4.9e-324 to 1.8e308)")
						continue
					}
					n.Metrics[k] = x
				case bool:
					n.Metrics[k] = x
				case string:
					if len(x) > maxMetricText {
						add(name(), "strings may be at most %d bytes", maxMetricText)
						continue
					}
					n.Metrics[k] = x
				default:
					add(name(), "must be a number, a string or a boolean, not %s", jsonKind(m[k]))
				}
			}
		}
	}

	if raw, ok := fields["tune"]; ok {
		n.Tune = decodeTune(raw, add)
	}

	if s, ok := str("callback_url"); ok {
		if reason := checkCallbackURL(s, allowHost); reason != "" {
			add("callback_url", "%s", reason)
		}
		n.CallbackURL = s
	}

	if raw, ok := fields["timestamp"]; ok {
		if t, ok := parseBodyTime(raw); ok {
			n.Timestamp = t
		} else {
			add("timestamp", "must be an RFC 3339 time (2026-12-03T10:00:00Z) or whole seconds since the epoch, not %s", jsonKind(raw))
		}
	}

	if s, ok := str("nonce"); ok {
		if s == "" || len(s) > maxNonce {
			add("nonce", "must be 1 to %d bytes", maxNonce)
		}
		n.Nonce = s
	}

	if s, ok := str("event_id"); ok {
		if !validKey(s) {
			add("event_id", "must be 1 to 255 printable ASCII characters")
		}
		n.EventID = s
	}
	return n, bad
}

// parseBodyTime reads a body's timestamp: an RFC 3339 string, or a JSON
// integer of seconds since the epoch.
func parseBodyTime(raw json.RawMessage) (time.Time, bool) {
	switch jsonKind(raw) {
	case "a string":
		s, _ := jsonString(raw)
		t, err := time.Parse(time.RFC3339Nano, s)
		return t.UTC(), err == nil && t.Year() >= 1970 && t.Year() < 10000
	case "a number":
		i, err := json.Number(bytes.TrimSpace(raw)).Int64()
		if err != nil || i < 0 || i > 253402300799 { // 9999-12-31T23:59:59Z
			return time.Time{}, false
		}
		return time.Unix(i, 0).UTC(), true
	}
	return time.Time{}, false
}

// checkCallbackURL returns why u may not be called back, or "".
func checkCallbackURL(s string, allowHost func(string) bool) string {
	if len(s) > maxURL {
		return fmt.Sprintf("must be at most %d characters", maxURL)
	}
	u, err := url.Parse(s)
	if err != nil || !u.IsAbs() || u.Host == "" {
		return "must be an absolute http or https URL"
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return "must be an http or https URL"
	}
	if u.User != nil {
		return "must not carry user information"
	}
	if u.Fragment != "" {
		return "must not carry a fragment"
	}
	if allowHost == nil || !allowHost(u.Hostname()) {
		return fmt.Sprintf("host %q is not on this source's callback_hosts allowlist", u.Hostname())
	}
	return ""
}

// hostAllowed reports whether host is on list: exact names or addresses
// (case-insensitive), or "*.example.org" for any name below example.org.
func hostAllowed(list []string, host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" {
		return false
	}
	for _, h := range list {
		h = strings.ToLower(h)
		if h == host {
			return true
		}
		if suf, ok := strings.CutPrefix(h, "*."); ok && strings.HasSuffix(host, "."+suf) {
			return true
		}
	}
	return false
}

// Alertmanager webhook payload, version 4 (notify/webhook Message and
// template.Data of prometheus/alertmanager). Unknown fields are ignored.
type amMessage struct {
	Version           string            `json:"version"`
	GroupKey          string            `json:"groupKey"`
	TruncatedAlerts   int               `json:"truncatedAlerts"`
	Status            string            `json:"status"`
	Receiver          string            `json:"receiver"`
	GroupLabels       map[string]string `json:"groupLabels"`
	CommonLabels      map[string]string `json:"commonLabels"`
	CommonAnnotations map[string]string `json:"commonAnnotations"`
	ExternalURL       string            `json:"externalURL"`
	Alerts            []json.RawMessage `json:"alerts"`
}

// Alert is one Alertmanager alert as an event carries it.
type Alert = requests.WebhookAlert

// Skipped names an alert that was not turned into an event.
type Skipped = webhookwire.Skipped

// AlertEvent is an alert that names an instance.
type AlertEvent struct {
	VMID  string
	Alert Alert
	Index int // in the message's alerts
}

// AlertBatch is a decoded Alertmanager notification.
type AlertBatch struct {
	Receiver        string       `json:"receiver"`
	Status          string       `json:"status"`
	GroupKey        string       `json:"groupKey,omitempty"`
	TruncatedAlerts int          `json:"truncatedAlerts,omitempty"`
	Alerts          int          `json:"alerts"`
	Events          []AlertEvent `json:"-"`
	Skipped         []Skipped    `json:"skipped"`
}

// DecodeAlertmanager decodes an Alertmanager notification tolerantly:
// unknown fields are ignored, alerts without a usable label are skipped
// and listed. Wrong types of known fields and bad statuses are invalid.
func DecodeAlertmanager(body []byte, label string) (AlertBatch, []api.InvalidParam) {
	var b AlertBatch
	var bad []api.InvalidParam
	add := func(name, format string, args ...any) {
		bad = append(bad, api.InvalidParam{Name: name, Reason: fmt.Sprintf(format, args...)})
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		add("(body)", "must be a JSON object")
		return b, bad
	}
	var m amMessage
	// Decode field by field so that every wrong type is named.
	for name, dst := range map[string]any{
		"version": &m.Version, "groupKey": &m.GroupKey, "truncatedAlerts": &m.TruncatedAlerts,
		"status": &m.Status, "receiver": &m.Receiver, "groupLabels": &m.GroupLabels,
		"commonLabels": &m.CommonLabels, "commonAnnotations": &m.CommonAnnotations,
		"externalURL": &m.ExternalURL, "alerts": &m.Alerts,
	} {
		raw, ok := top[name]
		if !ok || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			add(name, "has the wrong type (%s)", jsonKind(raw))
		}
	}
	if _, ok := top["alerts"]; !ok {
		add("alerts", "is required")
	}
	if m.Version != "" && m.Version != "4" {
		add("version", "must be \"4\" (Alertmanager's webhook payload version)")
	}
	if m.Status != "" && m.Status != "firing" && m.Status != "resolved" {
		add("status", "must be firing or resolved")
	}
	b.Receiver, b.Status, b.GroupKey, b.TruncatedAlerts, b.Alerts = m.Receiver, m.Status, m.GroupKey, m.TruncatedAlerts, len(m.Alerts)
	b.Skipped = []Skipped{}
	for i, raw := range m.Alerts {
		name := fmt.Sprintf("alerts[%d]", i)
		var a Alert
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
			add(name, "must be an object")
			continue
		}
		for f, dst := range map[string]any{
			"status": &a.Status, "labels": &a.Labels, "annotations": &a.Annotations, "startsAt": &a.StartsAt,
			"endsAt": &a.EndsAt, "generatorURL": &a.GeneratorURL, "fingerprint": &a.Fingerprint,
		} {
			r, ok := fields[f]
			if !ok || string(bytes.TrimSpace(r)) == "null" {
				continue
			}
			if err := json.Unmarshal(r, dst); err != nil {
				add(name+"."+f, "has the wrong type or form (%s)", jsonKind(r))
			}
		}
		if a.Status == "" {
			a.Status = m.Status
		}
		if a.Status != "firing" && a.Status != "resolved" {
			add(name+".status", "must be firing or resolved")
			continue
		}
		v, ok := a.Labels[label]
		if !ok {
			b.Skipped = append(b.Skipped, Skipped{Index: i, Fingerprint: a.Fingerprint, AlertName: a.Labels["alertname"],
				Reason: fmt.Sprintf("no label %s", label)})
			continue
		}
		u, ok := strictUUID(v)
		if !ok {
			b.Skipped = append(b.Skipped, Skipped{Index: i, Fingerprint: a.Fingerprint, AlertName: a.Labels["alertname"],
				Reason: fmt.Sprintf("label %s is not an instance UUID", label)})
			continue
		}
		b.Events = append(b.Events, AlertEvent{VMID: u.String(), Alert: a, Index: i})
	}
	sort.Slice(bad, func(i, j int) bool { return bad[i].Name < bad[j].Name })
	return b, bad
}

// Bounds of a webhook's tune: NVIDIA's drivers take timeslices of 1 to
// 30 ms; clocks_mhz -1 asks for the GPU's default clocks.
const (
	maxTuneTimesliceUS = 30000
	maxTuneClocksMHz   = 10000
)

// decodeTune reads a native body's "tune" object, reporting each bad
// field through add.
func decodeTune(raw json.RawMessage, add func(field, format string, args ...any)) *requests.WebhookTune {
	m, ok := objectFields(raw)
	if !ok {
		add("tune", "must be an object, not %s", jsonKind(raw))
		return nil
	}
	t := &requests.WebhookTune{}
	integer := func(k string, lo, hi int64) int {
		v, present := m[k]
		if !present {
			return 0
		}
		i, err := json.Number(bytes.TrimSpace(v)).Int64()
		if jsonKind(v) != "a number" || err != nil || i < lo || i > hi {
			add("tune."+k, "must be an integer from %d to %d", lo, hi)
			return 0
		}
		return int(i)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch k {
		case "scheduler", "timeslice_us", "clocks_mhz":
		default:
			add("tune."+k, "unknown field")
		}
	}
	if v, present := m["scheduler"]; present {
		s, ok := jsonString(v)
		if !ok || !oneOf(s, []string{"best_effort", "equal_share", "fixed_share"}) {
			add("tune.scheduler", "must be best_effort, equal_share or fixed_share")
		}
		t.Scheduler = s
	}
	t.TimesliceUS = integer("timeslice_us", 0, maxTuneTimesliceUS)
	t.ClocksMHz = integer("clocks_mhz", -1, maxTuneClocksMHz)
	if t.TimesliceUS != 0 && t.Scheduler != "equal_share" && t.Scheduler != "fixed_share" {
		add("tune.timeslice_us", "needs scheduler equal_share or fixed_share")
	}
	if t.Scheduler == "" && t.TimesliceUS == 0 && t.ClocksMHz == 0 {
		add("tune", "asks for nothing: give scheduler, timeslice_us or clocks_mhz")
	}
	return t
}
