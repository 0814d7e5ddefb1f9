package webhook

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/google/uuid"
)

func allowExample(h string) bool {
	return hostAllowed([]string{"scheduler.example.org", "*.jobs.example.org"}, h)
}

func TestDecodeNative(t *testing.T) {
	for _, c := range []struct {
		name string
		body string
		bad  []string // invalid field names, in order
	}{
		{"minimal release", `{"type":"GPU_RELEASE","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e"}`, nil},
		{"full", `{"type":"GPU_REQUEST","vm_id":"8B1A3F50-0B7C-4F2E-9D0A-8F6A1B2C3D4E","workload":"rendering","vgpu_profile":"A40-8Q",` +
			`"count":2,"metrics":{"q":3,"name":"x","hot":false},"callback_url":"https://a.jobs.example.org/cb"}`, nil},
		{"request needs workload", `{"type":"GPU_REQUEST","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e"}`, []string{"workload"}},
		{"braced uuid", `{"type":"GPU_LOAD","vm_id":"{8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e}"}`, []string{"vm_id"}},
		{"count fraction", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","count":1.5}`, []string{"count"}},
		{"count zero", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","count":0}`, []string{"count"}},
		{"count past the bound", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","count":1000000}`, []string{"count"}},
		{"nested metric", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","metrics":{"a":{"b":1},"c":null}}`, []string{"metrics.a", "metrics.c"}},
		{"callback off list", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","callback_url":"http://jobs.example.org.evil.com/"}`, []string{"callback_url"}},
		{"callback userinfo", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","callback_url":"https://u:p@scheduler.example.org/"}`, []string{"callback_url"}},
		{"callback scheme", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","callback_url":"file:///etc/passwd"}`, []string{"callback_url"}},
		{"everything wrong", `{"type":null,"vm_id":1,"workload":"x","vgpu_profile":"","count":"2","metrics":3,"callback_url":false,"z":1,"a":2}`,
			[]string{"a", "z", "type", "vm_id", "workload", "vgpu_profile", "count", "metrics", "callback_url"}},
		{"guest driver", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","guest_driver":"550.54.15"}`, nil},
		{"guest driver not a version", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","guest_driver":"latest"}`, []string{"guest_driver"}},
		{"guest driver not a string", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","guest_driver":550}`, []string{"guest_driver"}},
		{"tune", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","tune":{"scheduler":"fixed_share","timeslice_us":2000,"clocks_mhz":1200}}`, nil},
		{"tune clocks only, reset", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","tune":{"clocks_mhz":-1}}`, nil},
		{"tune not an object", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","tune":"fast"}`, []string{"tune"}},
		{"tune empty", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","tune":{}}`, []string{"tune"}},
		{"tune bad values", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","tune":{"scheduler":"round_robin","timeslice_us":99999,"clocks_mhz":1.5,"turbo":true}}`,
			[]string{"tune.turbo", "tune.scheduler", "tune.timeslice_us", "tune.clocks_mhz"}},
		{"tune timeslice without a share scheduler", `{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","tune":{"timeslice_us":2000}}`, []string{"tune.timeslice_us"}},
		{"not an object", `"GPU_REQUEST"`, []string{"(body)"}},
		{"null", `null`, []string{"(body)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, bad := DecodeNative([]byte(c.body), allowExample)
			var got []string
			for _, b := range bad {
				got = append(got, b.Name)
			}
			if len(got) != len(c.bad) {
				t.Fatalf("invalid = %v, want %v", bad, c.bad)
			}
			for i := range got {
				if got[i] != c.bad[i] {
					t.Errorf("invalid = %v, want %v", got, c.bad)
				}
			}
		})
	}
}

func TestDecodeAlertmanagerFixtures(t *testing.T) {
	for _, c := range []struct {
		file            string
		events, skipped int
	}{
		// Real older-shape payloads (prometheus-msteams, MIT): no instance label.
		{"prom_post_request.json", 0, 1},
		{"prom_post_request_2_alerts.json", 0, 2},
		// Built by hand from Alertmanager's documented fields (testdata/README).
		{"current_shape.json", 2, 1},
	} {
		t.Run(c.file, func(t *testing.T) {
			body, err := os.ReadFile(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			b, bad := DecodeAlertmanager(body, "instance_uuid")
			if len(bad) > 0 {
				t.Fatalf("invalid: %v", bad)
			}
			if len(b.Events) != c.events || len(b.Skipped) != c.skipped {
				t.Errorf("events %d skipped %d, want %d %d", len(b.Events), len(b.Skipped), c.events, c.skipped)
			}
			// With the label the older payloads do carry, they decode.
			if c.file == "prom_post_request.json" {
				b, _ = DecodeAlertmanager(body, "instance")
				if len(b.Skipped) != 1 || b.Skipped[0].Reason != "label instance is not an instance UUID" {
					t.Errorf("skipped = %+v", b.Skipped)
				}
			}
		})
	}
}

func corpusSeeds(f *testing.F) {
	for _, name := range []string{"prom_post_request.json", "prom_post_request_2_alerts.json", "current_shape.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"type":"GPU_REQUEST","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training","count":1,"metrics":{"u":0.9}}`))
	f.Add([]byte(`{"alerts":[{"status":"firing","labels":{"instance_uuid":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e"}}]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"type":"GPU_RELEASE","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","event_id":"job-4711/attempt-1"}`))
	f.Add([]byte(`{"type":"GPU_RELEASE","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","event_id":"caf\u00e9\u0000"}`))
	f.Add([]byte(`{"metrics":{"a":1e999}}`))
}

func FuzzDecodeNative(f *testing.F) {
	corpusSeeds(f)
	f.Add([]byte(`{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","tune":{"scheduler":"fixed_share","timeslice_us":2000,"clocks_mhz":-1}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		n, bad := DecodeNative(body, allowExample)
		if len(bad) > 0 {
			return
		}
		// What passes is a complete, re-encodable request.
		if n.Type == "" || n.VMID == "" || n.Count < 1 || n.Count > MaxCount {
			t.Fatalf("accepted %+v", n)
		}
		if tu := n.Tune; tu != nil && (tu.TimesliceUS < 0 || tu.TimesliceUS > maxTuneTimesliceUS || tu.ClocksMHz < -1 || tu.ClocksMHz > maxTuneClocksMHz ||
			(tu.Scheduler == "" && tu.TimesliceUS == 0 && tu.ClocksMHz == 0)) {
			t.Fatalf("accepted tune %+v", *tu)
		}
		if _, err := json.Marshal(n); err != nil {
			t.Fatalf("accepted body does not re-encode: %v", err)
		}
		// An event id is a usable idempotency key.
		if n.EventID != "" && !validKey(n.EventID) {
			t.Fatalf("accepted event_id %q", n.EventID)
		}
	})
}

func FuzzDecodeAlertmanager(f *testing.F) {
	corpusSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		b, bad := DecodeAlertmanager(body, "instance_uuid")
		if len(bad) > 0 {
			return
		}
		if len(b.Events)+len(b.Skipped) != b.Alerts {
			t.Fatalf("%d events + %d skipped != %d alerts", len(b.Events), len(b.Skipped), b.Alerts)
		}
		for _, ev := range b.Events {
			if _, ok := strictUUID(ev.VMID); !ok {
				t.Fatalf("event for %q", ev.VMID)
			}
		}
	})
}

// TestAnswerBytes: the 202's body built without reflection is byte for
// byte what json.Marshal writes (it is stored and replayed as it is),
// public URLs that JSON escapes included.
func TestAnswerBytes(t *testing.T) {
	for _, pub := range []string{"", "https://bridge.example.org:9443", `http://a/<b>&"c"\d`, "http://h/\u2028\xff"} {
		e := &Endpoint{cfg: Config{PublicURL: pub}, answerHead: answerHead(pub)}
		for range 3 {
			id := uuid.Must(uuid.NewV7())
			want, _ := json.Marshal(Answer{RequestID: id, StatusURL: pub + "/v1/requests/" + id.String(), Skipped: []Skipped{}})
			if got := e.answer(id); !bytes.Equal(got, want) {
				t.Errorf("public URL %q: answer\n%s, want\n%s", pub, got, want)
			}
		}
	}
}

// TestNativeJSON: the inbox payload spliced from the body's encoding holds
// what json.Marshal of the EventPayload holds (as jsonb stores it: the
// same members and values), and the body is json.Marshal's of Native.
func TestNativeJSON(t *testing.T) {
	for _, body := range []string{
		`{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training","metrics":{"util":0.93,"seq":1,"hot":true,"pool":"r<&>"}}`,
		`{"type":"GPU_REQUEST","vm_id":"8B1A3F50-0B7C-4F2E-9D0A-8F6A1B2C3D4E","workload":"inference","vgpu_profile":"T4-4Q","count":2,"callback_url":"https://127.0.0.1/cb","guest_driver":"550.54.15"}`,
		`{"type":"GPU_REQUEST","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training","timestamp":1700000000,"nonce":"n-1","event_id":"ev-1","tune":{"scheduler":"equal_share","timeslice_us":2000}}`,
		`{"type":"GPU_RELEASE","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","nonce":"x"}`,
	} {
		n, bad := DecodeNative([]byte(body), func(string) bool { return true })
		if len(bad) > 0 {
			t.Fatalf("%s: %v", body, bad)
		}
		id := uuid.Must(uuid.NewV7())
		src := `webhook:a"b<c>`
		gotBody, gotPayload := nativeJSON(n, id, src)
		wantBody, _ := json.Marshal(n)
		if !bytes.Equal(gotBody, wantBody) {
			t.Errorf("body %s, want %s", gotBody, wantBody)
		}
		wantPayload, _ := json.Marshal(EventPayload{RequestID: id, Source: src, Type: n.Type, VMID: n.VMID, Workload: n.Workload,
			VGPUProfile: n.VGPUProfile, Count: n.Count, Metrics: n.Metrics, CallbackURL: n.CallbackURL, GuestDriver: n.GuestDriver, Tune: n.Tune})
		var got, want map[string]any
		if err := json.Unmarshal([]byte(gotPayload), &got); err != nil {
			t.Fatalf("payload %s: %v", gotPayload, err)
		}
		json.Unmarshal(wantPayload, &want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("payload\n%s, want the members of\n%s", gotPayload, wantPayload)
		}
	}
}
