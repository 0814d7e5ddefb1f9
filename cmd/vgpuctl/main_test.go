package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// vgpuctl runs the command line in-process.
func vgpuctl(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHealthExitCodes(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if ready {
			json.NewEncoder(w).Encode(map[string]any{"status": "ready", "checks": map[string]string{"database": "ok", "broker": "ok"}})
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(503)
		json.NewEncoder(w).Encode(map[string]any{"status": 503, "title": "Not ready", "detail": "unreachable: database",
			"invalid_params": []map[string]string{{"name": "database", "reason": "connection refused"}}})
	}))
	defer srv.Close()

	tests := []struct {
		name     string
		ready    bool
		args     []string
		wantCode int
		wantOut  string
	}{
		{"ready table", true, nil, exitOK, "database  ok"},
		{"ready json", true, []string{"-o", "json"}, exitOK, `"status": "ready"`},
		{"ready yaml", true, []string{"-o", "yaml"}, exitOK, "status: ready"},
		{"not ready", false, nil, exitNotReady, "database  connection refused"},
		{"not ready json", false, []string{"-o", "json"}, exitNotReady, `"status": 503`},
		{"bad format", true, []string{"-o", "xml"}, exitUsage, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready = tt.ready
			code, out, errs := vgpuctl(append([]string{"health", "--url", srv.URL}, tt.args...)...)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d (stderr %s)", code, tt.wantCode, errs)
			}
			if !strings.Contains(out, tt.wantOut) {
				t.Errorf("output lacks %q:\n%s", tt.wantOut, out)
			}
		})
	}
}

func TestUnreachableExits4(t *testing.T) {
	for _, args := range [][]string{{"health"}, {"hosts"}, {"requests", "show", "x", "--watch"}} {
		code, _, errs := vgpuctl(append(args, "--url", "http://127.0.0.1:1")...)
		if code != exitNoAPI || !strings.Contains(errs, "cannot reach http://127.0.0.1:1") {
			t.Errorf("%v: exit %d, want %d; stderr %s", args, code, exitNoAPI, errs)
		}
	}
}

func TestUsageExits2(t *testing.T) {
	for _, args := range [][]string{
		{"health", "--bogus"},
		{"nosuch"},
		{"hosts", "show"},
		{"hosts", "show", "a", "b"},
		{"instances", "--limit", "many"},
		{"policy", "explain"},
		{"place", "--profile", "T4-4Q"},
		{"place", "--dry-run"},
		{"events", "--since", "yesterday"},
		{"completion", "powershell"},
		{"webhook", "send", "lab", "--body", "x.json"},
		{"webhook", "send", "lab", "--body", "/nonexistent", "--secret-file", "/nonexistent"},
	} {
		if code, _, errs := vgpuctl(append(args, "--url", "http://127.0.0.1:1")...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %s)", args, code, exitUsage, errs)
		}
	}
}

func TestVersionAndHelp(t *testing.T) {
	if code, out, _ := vgpuctl("version"); code != 0 || !strings.HasPrefix(out, "vgpuctl ") {
		t.Fatalf("version: %d %q", code, out)
	}
	code, out, _ := vgpuctl("--help")
	if code != 0 {
		t.Fatalf("help exit %d", code)
	}
	for _, want := range []string{"Exit codes:", "  4  the API could not be reached", "  5  a watched request ended failed or rejected", "VGPUCTL_TOKEN", "OS_CLOUD"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_vgpuctl", "zsh": "#compdef vgpuctl", "fish": "complete -c vgpuctl"} {
		code, out, errs := vgpuctl("completion", shell)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d, output lacks %q (stderr %s)", shell, code, want, errs)
		}
	}
}

// A problem answer is printed as "title: detail", each invalid field and
// the request id, and exits 1.
func TestProblemPrinted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(422)
		io.WriteString(w, `{"title":"Invalid request","status":422,"detail":"1 invalid field(s)","request_id":"req-42",
			"invalid_params":[{"name":"profile","reason":"unknown vGPU profile \"Z9-99Q\""}]}`)
	}))
	defer srv.Close()
	code, out, errs := vgpuctl("place", "--dry-run", "--profile", "Z9-99Q", "--url", srv.URL)
	want := "vgpuctl: Invalid request: 1 invalid field(s)\n  profile: unknown vGPU profile \"Z9-99Q\"\n  request id: req-42\n"
	if code != exitFailure || errs != want || out != "" {
		t.Errorf("exit %d, stderr %q (want %q), stdout %q", code, errs, want, out)
	}
}

func TestWatchExitCodes(t *testing.T) {
	var final atomic.Value
	var polls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		state := "accepted"
		if polls.Add(1) > 2 {
			state = final.Load().(string)
		}
		json.NewEncoder(w).Encode(map[string]any{"id": "r1", "source": "webhook:lab", "kind": "GPU_REQUEST", "state": state,
			"code": map[bool]string{true: "no_capacity"}[state == "rejected"], "reason": map[bool]string{true: "no GPU free"}[state == "rejected"],
			"created_at": "2024-05-01T12:00:00Z", "updated_at": "2024-05-01T12:00:01Z"})
	}))
	defer srv.Close()
	for _, tt := range []struct {
		final string
		args  []string
		code  int
	}{
		{"succeeded", nil, exitOK},
		{"rejected", nil, exitRequest},
		{"failed", []string{"-o", "json"}, exitRequest},
		{"accepted", []string{"--wait-timeout", "50ms"}, exitGaveUp},
	} {
		final.Store(tt.final)
		polls.Store(0)
		code, out, errs := vgpuctl(append([]string{"requests", "show", "r1", "--watch", "--interval", "5ms", "--url", srv.URL}, tt.args...)...)
		if code != tt.code {
			t.Errorf("%s: exit %d, want %d (stderr %s)", tt.final, code, tt.code, errs)
		}
		if tt.code != exitGaveUp && !strings.Contains(out, tt.final) {
			t.Errorf("%s: final request not printed:\n%s", tt.final, out)
		}
		if !strings.Contains(errs, "request r1: accepted") {
			t.Errorf("%s: progress lines missing on stderr:\n%s", tt.final, errs)
		}
		if tt.final == "rejected" && !strings.Contains(errs, "vgpuctl: request r1 ended rejected code no_capacity: no GPU free") {
			t.Errorf("rejected: stderr %s", errs)
		}
	}
}

func TestYAMLKeepsNumbers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"hosts":[{"name":"cn1","node":"cn1","gpu_count":2,"capacity":8,"used":1,"free":7,"ratio":1.5,"traits":[]}]}`)
	}))
	defer srv.Close()
	code, out, errs := vgpuctl("hosts", "-o", "yaml", "--url", srv.URL)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"gpu_count: 2\n", "ratio: 1.5\n", "name: cn1\n", "traits: []\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("yaml lacks %q:\n%s", want, out)
		}
	}
}

func TestExplainBody(t *testing.T) {
	dir := t.TempDir()
	ev := filepath.Join(dir, "ev.json")
	whole := filepath.Join(dir, "whole.json")
	st := filepath.Join(dir, "st.json")
	os.WriteFile(ev, []byte(`{"kind":"webhook.GPU_REQUEST","workload":"training"}`+"\n"), 0o600)
	os.WriteFile(whole, []byte(`{"event":{"kind":"alert"},"state":{"hosts":[]}}`), 0o600)
	os.WriteFile(st, []byte(`{"instances":[]}`), 0o600)
	for _, tt := range []struct{ ev, st, want string }{
		{ev, "", `{"event":{"kind":"webhook.GPU_REQUEST","workload":"training"}}`},
		{ev, st, `{"event":{"kind":"webhook.GPU_REQUEST","workload":"training"},"state":{"instances":[]}}`},
		{whole, "", `{"event":{"kind":"alert"},"state":{"hosts":[]}}`},
	} {
		b, err := explainBody(tt.ev, tt.st)
		if err != nil || string(b) != tt.want {
			t.Errorf("explainBody(%s, %s) = %s, %v; want %s", tt.ev, tt.st, b, err, tt.want)
		}
	}
}

// --os-cloud logs in to Keystone through clouds.yaml and sends the token.
func TestOSCloudSendsKeystoneToken(t *testing.T) {
	ks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v3/auth/tokens" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Subject-Token", "ks-token-1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"token":{"methods":["password"],"expires_at":"2099-01-01T00:00:00.000000Z","catalog":[],
			"user":{"id":"u","name":"ops","domain":{"id":"default","name":"Default"}}}}`)
	}))
	defer ks.Close()
	var got atomic.Value
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("X-Auth-Token"))
		io.WriteString(w, `{"gpus":[]}`)
	}))
	defer api.Close()
	path := filepath.Join(t.TempDir(), "clouds.yaml")
	os.WriteFile(path, []byte("clouds:\n  lab:\n    auth:\n      auth_url: "+ks.URL+"/v3\n      username: ops\n      password: pw\n      project_name: admin\n      user_domain_name: Default\n      project_domain_name: Default\n"), 0o600)
	t.Setenv("OS_CLIENT_CONFIG_FILE", path)
	t.Setenv("VGPUCTL_TOKEN", "")
	if code, _, errs := vgpuctl("gpus", "--os-cloud", "lab", "--url", api.URL); code != 0 || got.Load() != "ks-token-1" {
		t.Fatalf("exit %d, token %v, stderr %s", code, got.Load(), errs)
	}
	// A static token wins over the cloud: no Keystone call needed.
	t.Setenv("VGPUCTL_TOKEN", "static")
	t.Setenv("OS_CLOUD", "lab")
	if code, _, errs := vgpuctl("gpus", "--url", api.URL); code != 0 || got.Load() != "static" {
		t.Fatalf("exit %d, token %v, stderr %s", code, got.Load(), errs)
	}
	t.Setenv("VGPUCTL_TOKEN", "")
	if code, _, errs := vgpuctl("gpus", "--os-cloud", "absent", "--url", api.URL); code != exitFailure || !strings.Contains(errs, `cloud "absent" not found`) {
		t.Fatalf("unknown cloud: exit %d, stderr %s", code, errs)
	}
}

// On a terminal the watch shows a spinner instead of progress lines.
func TestWatchSpinnerOnTerminal(t *testing.T) {
	var polls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		state := map[bool]string{true: "succeeded", false: "dispatched"}[polls.Add(1) > 3]
		json.NewEncoder(w).Encode(map[string]any{"id": "r9", "state": state, "phase": "attaching"})
	}))
	defer srv.Close()
	var errb bytes.Buffer
	g := &globals{url: srv.URL, output: outTable, stdout: io.Discard, stderr: &errb, tty: func() bool { return true }}
	r, err := g.watch(context.Background(), "r9", watchFlags{interval: 150 * time.Millisecond})
	if err != nil || r.State != "succeeded" {
		t.Fatalf("watch: %+v %v", r, err)
	}
	if !strings.Contains(errb.String(), "request r9: dispatched (attaching)") || strings.Contains(errb.String(), "\n20") {
		t.Errorf("spinner output: %q", errb.String())
	}
}

// FuzzEmit: whatever JSON the API answers, json and yaml output render it
// without failing, and YAML keeps integers as numbers.
func FuzzEmit(f *testing.F) {
	f.Add(`{"hosts":[{"name":"cn1","gpu_count":2,"ratio":1.5,"traits":[]}]}`)
	f.Add(`{"n":12345678901234567890,"f":1e400,"s":"x","z":null,"a":[[],{}]}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, raw string) {
		if !json.Valid([]byte(raw)) {
			return
		}
		for _, o := range []string{outJSON, outYAML} {
			var out bytes.Buffer
			g := &globals{output: o, stdout: &out}
			if err := g.emit(json.RawMessage(raw), nil); err != nil {
				t.Fatalf("%s of %q: %v", o, raw, err)
			}
		}
	})
}

// TestPolicyReplay: vgpuctl sends the window and the candidate's text, and
// shows the events side by side with the summary.
func TestPolicyReplay(t *testing.T) {
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/policy/replay" {
			http.NotFound(w, r)
			return
		}
		json.NewDecoder(r.Body).Decode(&got)
		io.WriteString(w, `{"events": [
{"id": 7, "kind": "webhook.GPU_LOAD", "instance_uuid": "vm1", "time": "2026-12-05T08:00:00Z",
 "active": {"intents": []}, "candidate": {"intents": [{"kind": "resize", "profile": "T4-8Q"}, {"kind": "notify"}]}, "differs": ["resize", "notify"]}],
"summary": {"events": 1, "evaluated": 1, "failed": 0, "differing": 1, "differ": {"resize": 1, "notify": 1}, "truncated": false, "max_events": 1000}}`)
	}))
	defer srv.Close()
	rules := filepath.Join(t.TempDir(), "candidate.yaml")
	os.WriteFile(rules, []byte("version: 1\nrules: []\n"), 0o600)
	code, out, errs := vgpuctl("policy", "replay", "--url", srv.URL, "--rules", rules, "--since", "2026-12-05T00:00:00Z", "--until", "2026-12-06T00:00:00Z")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if got["rules"] != "version: 1\nrules: []\n" || got["since"] != "2026-12-05T00:00:00Z" || got["until"] != "2026-12-06T00:00:00Z" {
		t.Errorf("body = %v", got)
	}
	for _, want := range []string{"resize(T4-8Q) notify", "resize,notify", "events: 1 read, 1 evaluated, 0 failed, 1 differ",
		"would differ: attach 0, release 0, resize 1, move 0, tune 0, set_limits 0, notify 1, reject 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code, _, _ := vgpuctl("policy", "replay", "--url", srv.URL, "--rules", rules, "--since", "yesterday"); code != exitUsage {
		t.Errorf("--since yesterday: exit %d, want %d", code, exitUsage)
	}
}
