package api

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestDuplicateKey(t *testing.T) {
	tests := []struct {
		in   string
		path string
	}{
		{`{"a":1,"b":2}`, ""},
		{`{"a":1,"a":2}`, "a"},
		{`{"m":{"x":1,"y":{"x":2}},"n":[{"x":1},{"x":1,"z":[1,{"q":1,"q":2}]}]}`, "n[1].z[1].q"},
		{`[{"a":1},{"a":1}]`, ""},
		{`{"a":{"b":1},"c":{"b":1,"b":3}}`, "c.b"},
		{`{"\u0061":1,"a":2}`, "a"}, // escapes name the same member
		{`"just a string"`, ""},
		{`{"a":`, ""}, // not JSON: the decoder says so
	}
	for _, tc := range tests {
		path, ok := DuplicateKey([]byte(tc.in))
		if path != tc.path || ok != (tc.path != "") {
			t.Errorf("DuplicateKey(%s) = %q, %v; want %q", tc.in, path, ok, tc.path)
		}
	}
}

func TestHasNULEscape(t *testing.T) {
	tests := map[string]bool{
		`{"a":"x\u0000y"}`:     true,
		`{"a":"x\\u0000y"}`:    false, // a backslash, then the text u0000
		`{"a":"x\\\u0000y"}`:   true,  // a backslash, then a NUL
		`{"a":"x\\\\u0000y"}`:  false,
		`{"\u0000":1}`:         true,
		`{"a":"u0000"}`:        false,
		`{"a":"\u00000"}`:      true,
		`{"a":"\\\\\\\u0000"}`: true,
	}
	for in, want := range tests {
		if got := HasNULEscape([]byte(in)); got != want {
			t.Errorf("HasNULEscape(%s) = %v, want %v", in, got, want)
		}
	}
}

// nulIn reports whether any string of a decoded JSON value, member names
// included, holds a NUL: what HasNULEscape must say of valid JSON.
func nulIn(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsRune(x, 0)
	case []any:
		for _, e := range x {
			if nulIn(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if strings.ContainsRune(k, 0) || nulIn(e) {
				return true
			}
		}
	}
	return false
}

// countMembers counts the member names of every object as written, which
// exceeds what decoding keeps exactly when a name repeats in an object.
func countMembers(t *testing.T, b []byte) (written, kept int) {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return 0, 0
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			kept += len(x)
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	dec := json.NewDecoder(strings.NewReader(string(b)))
	// Every string token in key position is a member name.
	type frame struct{ obj, wantKey bool }
	var st []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if n := len(st); n > 0 && st[n-1].obj && st[n-1].wantKey {
			if _, ok := tok.(string); ok {
				written++
				st[n-1].wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			st = append(st, frame{obj: true, wantKey: true})
		case json.Delim('['):
			st = append(st, frame{})
		case json.Delim('}'), json.Delim(']'):
			st = st[:len(st)-1]
			if n := len(st); n > 0 && st[n-1].obj {
				st[n-1].wantKey = true
			}
		default:
			if n := len(st); n > 0 && st[n-1].obj {
				st[n-1].wantKey = true
			}
		}
	}
	return written, kept
}

// FuzzJSONText checks the body checks against decoding: on valid JSON,
// HasNULEscape is true exactly when a decoded string holds a NUL, and
// DuplicateKey finds a name exactly when decoding drops a member. Neither
// panics on anything.
func FuzzJSONText(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":1,"a":2}`, `{"a":"\u0000"}`, `{"a":"\\u0000"}`, `[{"x":[{"y":1,"y":1}]}]`,
		`{"\u0061":1,"a":1}`, "{\"a\":\"\xff\"}", `{"a":{"b":{"c":{}}},"d":[]}`, `{`, `"{\"a\":1}"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		nul := HasNULEscape(b)
		path, dup := DuplicateKey(b)
		_ = CheckJSONText(b)
		if !json.Valid(b) {
			return
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return
		}
		if want := nulIn(v); nul != want {
			t.Errorf("HasNULEscape(%q) = %v, decoded strings hold a NUL: %v", b, nul, want)
		}
		written, kept := countMembers(t, b)
		if dup != (written > kept) {
			t.Errorf("DuplicateKey(%q) = %q %v; members written %d, kept %d", b, path, dup, written, kept)
		}
	})
}

func BenchmarkCheckJSONText(b *testing.B) {
	body := []byte(`{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training","metrics":{"util":0.93,"seq":12345},"nonce":"n-123"}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if CheckJSONText(body) != nil {
			b.Fatal("refused")
		}
	}
}
