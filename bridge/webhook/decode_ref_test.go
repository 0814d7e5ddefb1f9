package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

// FuzzDecodeNativeSameAsReference: DecodeNative decides every body as the
// straightforward decoder it replaced (decodeNativeReference, kept here)
// does.
func FuzzDecodeNativeSameAsReference(f *testing.F) {
	for _, s := range []string{
		`{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training","metrics":{"util":0.93,"seq":1}}`,
		`{"type":"GPU_REQUEST","vm_id":"8B1A3F50-0B7C-4F2E-9D0A-8F6A1B2C3D4E","workload":"rendering","vgpu_profile":"A40-8Q","count":2,"metrics":{"q":3,"name":"x\u00e9\n","hot":false,"n":null,"o":{},"a":[]},"callback_url":"https://a.jobs.example.org/cb"}`,
		`{"type":null,"vm_id":1,"workload":"x","vgpu_profile":"","count":"2","metrics":3,"callback_url":false,"z":1,"a":2}`,
		`{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","count":1e1,"metrics":{"s":"\ud800","t":"\"q\""}}`,
		`{"type" : "GPU_LOAD" , "vm_id" : "8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e" , "count" : 16 }`,
		"{\"type\":\"GPU\xff_LOAD\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return // the handler answers 400 first
		}
		n, bad := DecodeNative(body, allowExample)
		rn, rbad := decodeNativeReference(body, allowExample)
		if !reflect.DeepEqual(n, rn) || !reflect.DeepEqual(bad, rbad) {
			t.Fatalf("DecodeNative = %#v %v\nreference    %#v %v", n, bad, rn, rbad)
		}
	})
}

// decodeNativeReference is DecodeNative as first written.
func decodeNativeReference(body []byte, allowHost func(string) bool) (Native, []api.InvalidParam) {
	var n Native
	var bad []api.InvalidParam
	add := func(name, format string, args ...any) {
		bad = append(bad, api.InvalidParam{Name: name, Reason: fmt.Sprintf(format, args...)})
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		add("(body)", "must be a JSON object")
		return n, bad
	}
	str := func(name string) (string, bool) {
		raw, ok := fields[name]
		if !ok {
			return "", false
		}
		var s string
		if jsonKind(raw) != "a string" || json.Unmarshal(raw, &s) != nil {
			add(name, "must be a string, not %s", jsonKind(raw))
			return "", false
		}
		return s, true
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		switch k {
		case "type", "vm_id", "workload", "vgpu_profile", "count", "metrics", "callback_url":
		default:
			add(k, "unknown field")
		}
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

	n.Count = 1
	if raw, ok := fields["count"]; ok {
		var c json.Number
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if jsonKind(raw) != "a number" || dec.Decode(&c) != nil {
			add("count", "must be an integer, not %s", jsonKind(raw))
		} else if i, err := c.Int64(); err != nil || i < 1 || i > MaxCount {
			add("count", "must be an integer from 1 to %d", MaxCount)
		} else {
			n.Count = int(i)
		}
	}

	if raw, ok := fields["metrics"]; ok {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil || m == nil {
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
				name := "metrics." + k
				if k == "" || len(k) > maxMetricKey {
					add(name, "names must be 1 to %d characters", maxMetricKey)
					continue
				}
				var v any
				dec := json.NewDecoder(bytes.NewReader(m[k]))
				dec.UseNumber()
				_ = dec.Decode(&v)
				switch x := v.(type) {
				case json.Number, bool:
					n.Metrics[k] = x
				case string:
					if len(x) > maxMetricText {
						add(name, "strings may be at most %d bytes", maxMetricText)
						continue
					}
					n.Metrics[k] = x
				default:
					add(name, "must be a number, a string or a boolean, not %s", jsonKind(m[k]))
				}
			}
		}
	}

	if s, ok := str("callback_url"); ok {
		if reason := checkCallbackURL(s, allowHost); reason != "" {
			add("callback_url", "%s", reason)
		}
		n.CallbackURL = s
	}
	return n, bad
}
