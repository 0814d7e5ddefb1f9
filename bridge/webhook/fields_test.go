package webhook

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestObjectFields(t *testing.T) {
	for _, c := range []struct {
		name, in string
		ok       bool
	}{
		{"empty", `{}`, true},
		{"spaces", " \t{ \"a\" : 1 , \"b\":[1,{\"c\":\"}\"}] }\n", true},
		{"nested and escapes", `{"a":{"b":"x\"}"},"k\u00e9y":"v\\","n":null,"t":true,"f":-1.5e3}`, true},
		{"repeated name, last wins", `{"a":1,"a":2}`, true},
		{"invalid UTF-8 in a key", "{\"k\xff\":1}", true},
		{"null", `null`, false},
		{"array", `[{"a":1}]`, false},
		{"string", `"{}"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := objectFields([]byte(c.in))
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			var want map[string]json.RawMessage
			if err := json.Unmarshal([]byte(c.in), &want); err != nil {
				t.Fatal(err)
			}
			if !sameFields(got, want) {
				t.Fatalf("objectFields = %q, json.Unmarshal = %q", got, want)
			}
		})
	}
}

// FuzzObjectFields: on valid JSON, objectFields finds what json.Unmarshal
// into a map of raw messages finds, or declines (a body that is not an
// object).
func FuzzObjectFields(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":"x","c":{"d":[1,2,{"e":null}]}}`, `{"a\"b":"\\","a":true}`, `[]`, `1`, ` { "x" : -0.5E+2 } `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		got, ok := objectFields(b)
		var want map[string]json.RawMessage
		err := json.Unmarshal(b, &want)
		if !ok {
			if err == nil && want != nil {
				t.Fatalf("objectFields declined %q, which json.Unmarshal splits into %q", b, want)
			}
			return
		}
		if err != nil || !sameFields(got, want) {
			t.Fatalf("objectFields(%q) = %q, json.Unmarshal = %q (%v)", b, got, want, err)
		}
	})
}

func sameFields(a, b map[string]json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !reflect.DeepEqual([]byte(v), []byte(w)) {
			return false
		}
	}
	return true
}
