package policyapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

func server(t *testing.T, live *policy.MemState) *api.Server {
	t.Helper()
	h, err := policy.NewHolder(policy.Config{
		RulesFile:    "../../etc/vgpu-bridge/rules.yaml",
		ProfilesFile: "../../etc/vgpu-bridge/profiles.yaml",
		CompatFile:   "../../etc/vgpu-bridge/driver-compat.yaml",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: api.NoAuth{}})
	cfg := Config{Holder: h}
	if live != nil {
		cfg.State = func() policy.State { return live }
	}
	New(cfg).Register(srv)
	return srv
}

func post(srv *api.Server, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/policy/explain", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, req)
	return rec
}

func TestExplainWithStateInRequest(t *testing.T) {
	srv := server(t, nil)
	rec := post(srv, `{"event": {"kind": "webhook.GPU_REQUEST", "instance_uuid": "vm1", "workload": "inference", "time": "2025-03-01T12:00:00Z"},
		"state": {"instances": [{"uuid": "vm1", "project_id": "p1", "host": "cmp1"}],
		          "hosts": [{"name": "cmp1", "driver_version": "470.82.01", "gpus": [{"address": "0000:81:00.0", "model": "T4"}]}]}}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var d struct {
		Intents []policy.Intent
		Rules   []policy.RuleTrace
		Text    string
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Intents) != 1 || d.Intents[0].Profile != "T4-4C" || d.Intents[0].Kind != policy.IntentAttach {
		t.Errorf("intents = %+v", d.Intents)
	}
	if !strings.Contains(d.Text, "fired    explicit-request") || len(d.Rules) == 0 {
		t.Errorf("text = %s", d.Text)
	}
}

func TestExplainUsesLiveState(t *testing.T) {
	live := &policy.MemState{Instances: []policy.Instance{{UUID: "vm9", ProjectID: "p", VGPUs: []policy.VGPU{{Profile: "T4-4Q", Count: 1}}}}}
	srv := server(t, live)
	rec := post(srv, `{"event": {"kind": "webhook.GPU_RELEASE", "instance_uuid": "vm9"}}`)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"kind":"release"`) {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
}

func TestExplainValidation(t *testing.T) {
	srv := server(t, nil)
	for body, want := range map[string]string{
		`{}`:                                    `"name":"event"`,
		`{"event": {}}`:                         `"name":"event.kind"`,
		`{"event": {"kind": 3}}`:                `"invalid_params"`,
		`{"event": {"kind": "x"}, "colour": 1}`: `"name":"colour"`,
		`not json`:                              `not valid JSON`,
	} {
		rec := post(srv, body)
		if rec.Code < 400 || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("%s: %d %s, want %s", body, rec.Code, rec.Body, want)
		}
	}
}

func TestRouteDescribed(t *testing.T) {
	srv := server(t, nil)
	if u := srv.Undescribed(); len(u) != 0 {
		t.Errorf("undescribed routes: %v", u)
	}
}
