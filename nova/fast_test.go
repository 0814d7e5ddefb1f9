package nova_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
)

// fastSeeds are bodies at the edges of what the fast path takes.
var fastSeeds = []struct {
	name string
	body string
	fast bool // the fast path decides it
}{
	{"legacy", inner, true},
	{"envelope", envelope(inner), true},
	{"envelope spaced", strings.Replace(envelope(inner), `,"oslo.message":`, " ,\n\t\"oslo.message\" : ", 1), true},
	{"envelope message first", `{"oslo.message":` + quote(inner) + `,"oslo.version":"2.0"}`, true},
	{"escaped key", strings.Replace(inner, `"message_id"`, `"message\u005fid"`, 1), true},
	{"unicode", strings.Replace(inner, `"u1"`, `"\u00e9t\u00e9 ☃"`, 1), true},
	{"surrogate pair", strings.Replace(inner, `"u1"`, `"\ud83d\ude00"`, 1), false},
	{"lone surrogate", strings.Replace(inner, `"u1"`, `"\ud83d"`, 1), false},
	{"invalid utf-8", strings.Replace(inner, `"u1"`, "\"\xff\"", 1), false},
	{"case-folded key", strings.Replace(inner, `"message_id"`, `"Message_ID"`, 1), false},
	{"duplicate key", strings.Replace(inner, `{"message_id":"m1",`, `{"message_id":"m0","message_id":"m1",`, 1), true},
	{"null field", strings.Replace(inner, `"_unique_id":"u1"`, `"_unique_id":null`, 1), true},
	{"number field", strings.Replace(inner, `"message_id":"m1"`, `"message_id":1`, 1), false},
	{"payload twice", strings.Replace(inner, `"_unique_id"`, `"payload":{},"_unique_id"`, 1), false},
	{"payload null name", strings.Replace(inner, `"nova_object.name":"ServiceStatusPayload"`, `"nova_object.name":null`, 1), true},
	{"payload changes", strings.Replace(inner, `"nova_object.data"`, `"nova_object.changes":["host"],"nova_object.data"`, 1), true},
	{"numbers", strings.Replace(inner, `"future_field":{"x":1}`, `"f":[0,-1,2.5e+3,1E-2,true,false,null,{},[]]`, 1), true},
	{"bad number", strings.Replace(inner, `"future_field":{"x":1}`, `"f":01`, 1), false},
	{"trailing garbage", inner + "x", false},
	{"trailing space", inner + " \n", true},
	{"envelope extra key", strings.Replace(envelope(inner), `{`, `{"x":1,`, 1), false},
	{"envelope v3", strings.Replace(envelope(inner), `"2.0"`, `"3.0"`, 1), false},
	{"nested envelope", envelope(envelope(inner)), false},
	{"html in name", strings.Replace(inner, `"ServiceStatusPayload"`, `"Service<Status>&Payload"`, 1), true},
}

func TestFastPathEdges(t *testing.T) {
	for _, tc := range fastSeeds {
		t.Run(tc.name, func(t *testing.T) {
			_, _, ok := nova.DecodeFast([]byte(tc.body))
			if ok != tc.fast {
				t.Errorf("fast path took it: %v, want %v", ok, tc.fast)
			}
			checkSameDecode(t, []byte(tc.body))
		})
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// checkSameDecode fails when the fast path decides body differently from
// the reference path.
func checkSameDecode(t *testing.T, body []byte) {
	t.Helper()
	fm, ferr, ok := nova.DecodeFast(body)
	if !ok {
		return
	}
	rm, rerr := nova.DecodeReference(body)
	if (ferr == nil) != (rerr == nil) || ferr != nil && ferr.Error() != rerr.Error() {
		t.Fatalf("fast path error %v, reference %v", ferr, rerr)
	}
	if !reflect.DeepEqual(fm, rm) {
		t.Fatalf("fast path decoded\n%+v\nreference\n%+v", fm, rm)
	}
}

func TestFastPathSamples(t *testing.T) {
	samples, err := novatest.Samples(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		body := s.Wire("id-"+s.Name, time.Unix(1714564800, 123456000))
		if _, _, ok := nova.DecodeFast(body); !ok {
			t.Errorf("%s: the fast path left it to the reference path", s.Name)
		}
		checkSameDecode(t, body)
	}
}

// FuzzFastPath: whatever the fast path decides, the reference path decides
// the same way.
func FuzzFastPath(f *testing.F) {
	for _, tc := range fastSeeds {
		f.Add([]byte(tc.body))
	}
	if samples, err := novatest.Samples(samplesDir); err == nil {
		for i, s := range samples {
			if i%5 == 0 {
				f.Add(s.Wire("id", time.Unix(1714564800, 0)))
				f.Add(s.JSON)
			}
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkSameDecode(t, body)
	})
}

// TestDecodeReusesNoInput: Decode unquotes oslo.message into buffers it
// reuses; each message decodes as the reference path decodes it, and no
// body is written to (an oslo.message without escapes is a slice of its
// body, never kept as a buffer).
func TestDecodeReusesNoInput(t *testing.T) {
	samples, err := novatest.Samples(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	plain := []byte(`{"oslo.version":"2.0","oslo.message":"not json, longer than any message` + strings.Repeat(".", 20000) + `"}`)
	keep := string(plain)
	for round := 0; round < 2; round++ {
		for _, s := range samples {
			if _, err := nova.Decode(plain); err == nil {
				t.Fatal("a broken message decoded")
			}
			body := s.Wire("id-"+s.Name, time.Unix(1714564800, 0))
			orig := string(body)
			m, err := nova.Decode(body)
			rm, rerr := nova.DecodeReference([]byte(orig))
			if (err == nil) != (rerr == nil) || !reflect.DeepEqual(m, rm) {
				t.Fatalf("%s: decoded %+v (%v), reference %+v (%v)", s.Name, m, err, rm, rerr)
			}
			if string(body) != orig || string(plain) != keep {
				t.Fatalf("%s: Decode wrote to its input", s.Name)
			}
		}
	}
}
