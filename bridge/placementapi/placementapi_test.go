package placementapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

func server(t *testing.T) *api.Server {
	t.Helper()
	cat := catalog.New()
	p, err := catalog.NewProfile("nvidia-232", "GRID T4-4Q", 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Add(p); err != nil {
		t.Fatal(err)
	}
	// No call reaches this endpoint: the index is filled by hand.
	svc, err := placement.New(context.Background(), placement.Config{Client: placement.ClientConfig{Endpoint: "http://127.0.0.1:1", Token: "x"}}, nil, cat, nil)
	if err != nil {
		t.Fatal(err)
	}
	inv := map[string]engine.Inventory{"VGPU": {Total: 4, MaxUnit: 4, StepSize: 1, MinUnit: 1, AllocationRatio: 1}}
	svc.Index().Load([]engine.Provider{
		{UUID: "11111111-1111-1111-1111-111111111111", Name: "cn1", RootUUID: "11111111-1111-1111-1111-111111111111"},
		{UUID: "22222222-2222-2222-2222-222222222222", Name: "cn1_pci_0000_84_00_0", RootUUID: "11111111-1111-1111-1111-111111111111",
			ParentUUID: "11111111-1111-1111-1111-111111111111", Traits: []string{"CUSTOM_NVIDIA_232"}, Inventory: inv, Usages: map[string]int{"VGPU": 1}},
	})
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: api.NoAuth{}})
	New(svc).Register(srv)
	return srv
}

func do(srv *api.Server, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, req)
	return rec
}

func TestDryRun(t *testing.T) {
	srv := server(t)
	rec := do(srv, http.MethodPost, "/v1/placements/dry-run", `{"profile": "T4-4Q", "count": 2}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var out placement.DryRunResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Candidates) != 1 {
		t.Fatalf("candidates %+v", out)
	}
	c := out.Candidates[0]
	if c.Host != "cn1" || c.PCIAddress != "0000:84:00.0" || c.Profile != "T4-4Q" || c.Amount != 2 || c.FreeAfter != 1 || c.Reason == "" {
		t.Errorf("candidate %+v", c)
	}
}

func TestDryRunValidation(t *testing.T) {
	srv := server(t)
	for body, field := range map[string]string{
		`{}`:                                    "profile",
		`{"profile": "T4-4Q", "count": -1}`:     "count",
		`{"profile": "T4-4Q", "limit": 5000}`:   "limit",
		`{"profile": "T4-4Q", "strategy": "x"}`: "strategy",
		`{"profile": "Z9-99Q"}`:                 "profile",
		`{"profile": "T4-4Q", "colour": "red"}`: "colour",
	} {
		rec := do(srv, http.MethodPost, "/v1/placements/dry-run", body)
		if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), `"name":"`+field+`"`) {
			t.Errorf("%s: status %d %s, want 422 naming %s", body, rec.Code, rec.Body, field)
		}
	}
}

func TestReads(t *testing.T) {
	srv := server(t)
	for path, want := range map[string]string{
		"/v1/gpus":                      `"free":3`,
		"/v1/gpus?profile=T4-4Q":        `"pci_address":"0000:84:00.0"`,
		"/v1/hosts":                     `"gpu_count":1`,
		"/v1/hosts/cn1":                 `"gpus":[`,
		"/v1/allocations?instance=nope": `"instance"`,
	} {
		rec := do(srv, http.MethodGet, path, "")
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s: %d %s, want %s", path, rec.Code, rec.Body, want)
		}
	}
	if rec := do(srv, http.MethodGet, "/v1/hosts/nowhere", ""); rec.Code != http.StatusNotFound {
		t.Errorf("unknown host: %d", rec.Code)
	}
	if rec := do(srv, http.MethodGet, "/v1/gpus?profile=A16-1Q", ""); strings.Contains(rec.Body.String(), "provider_uuid") {
		t.Errorf("profile filter: %s", rec.Body)
	}
}

func TestEveryRouteDescribed(t *testing.T) {
	srv := server(t)
	if u := srv.Undescribed(); len(u) != 0 {
		t.Fatalf("undescribed routes: %v", u)
	}
}
