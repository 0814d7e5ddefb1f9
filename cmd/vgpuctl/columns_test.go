package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fleetStub answers GET /v1/hosts (two hosts, one with a node) and
// GET /v1/hosts/compute-1.
func fleetStub(t *testing.T) *httptest.Server {
	t.Helper()
	c1 := map[string]any{"name": "compute-1", "node": "node-1", "root_provider_uuid": "rp-1", "gpu_count": 2, "capacity": 8,
		"used": 3, "free": 5, "traits": []string{"CUSTOM_A", "CUSTOM_B"}}
	c2 := map[string]any{"name": "compute 2", "node": "", "root_provider_uuid": "rp-2", "gpu_count": 1, "capacity": 4, "used": 0, "free": 4}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/hosts":
			json.NewEncoder(w).Encode(map[string]any{"hosts": []any{c1, c2}})
		case "/v1/hosts/compute-1":
			json.NewEncoder(w).Encode(c1)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestFormatsAndColumns: -f and -c as the openstack client has them, on a
// list and on a show; -o stays an alias of -f.
func TestFormatsAndColumns(t *testing.T) {
	srv := fleetStub(t)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string // the whole of stdout
	}{
		{"value one column", []string{"hosts", "-f", "value", "-c", "name"}, exitOK, "compute-1\ncompute 2\n"},
		{"value two columns in the order named", []string{"hosts", "-f", "value", "-c", "FREE", "-c", "Name"}, exitOK,
			"5 compute-1\n4 compute 2\n"},
		{"value empty cell", []string{"hosts", "-f", "value", "-c", "node"}, exitOK, "node-1\n\n"},
		{"value every column", []string{"hosts", "-f", "value"}, exitOK,
			"compute-1 node-1 2 8 3 5\ncompute 2  1 4 0 4\n"},
		{"csv", []string{"hosts", "-f", "csv", "-c", "name", "-c", "used"}, exitOK, "NAME,USED\ncompute-1,3\ncompute 2,0\n"},
		{"json columns", []string{"hosts", "-f", "json", "-c", "name", "-c", "free"}, exitOK,
			"[\n  {\n    \"free\": \"5\",\n    \"name\": \"compute-1\"\n  },\n  {\n    \"free\": \"4\",\n    \"name\": \"compute 2\"\n  }\n]\n"},
		{"yaml columns", []string{"hosts", "-f", "yaml", "-c", "name"}, exitOK, "- name: compute-1\n- name: compute 2\n"},
		{"table columns", []string{"hosts", "-c", "name", "-c", "gpus"}, exitOK, "NAME       GPUS\ncompute-1  2\ncompute 2  1\n"},
		{"-o is -f", []string{"hosts", "-o", "value", "-c", "name"}, exitOK, "compute-1\ncompute 2\n"},
		{"show value", []string{"hosts", "show", "compute-1", "-f", "value", "-c", "traits"}, exitOK, "CUSTOM_A,CUSTOM_B\n"},
		{"show field by its spaced name", []string{"hosts", "show", "compute-1", "-f", "value", "-c", "root_provider", "-c", "vGPU capacity"},
			exitOK, "rp-1\n8\n"},
		{"show json", []string{"hosts", "show", "compute-1", "-f", "json", "-c", "name", "-c", "used"}, exitOK,
			"{\n  \"name\": \"compute-1\",\n  \"used\": \"3\"\n}\n"},
		{"show csv", []string{"hosts", "show", "compute-1", "-f", "csv", "-c", "name"}, exitOK, "Field,Value\nName,compute-1\n"},
		{"show table", []string{"hosts", "show", "compute-1", "-c", "free"}, exitOK, "Free:  5\n"},
		{"unknown column", []string{"hosts", "-f", "value", "-c", "colour"}, exitUsage, ""},
		{"unknown format", []string{"hosts", "-f", "xml"}, exitUsage, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := vgpuctl(append(tt.args, "--url", srv.URL)...)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d (stderr %s)", code, tt.wantCode, errs)
			}
			if out != tt.want {
				t.Errorf("stdout:\n%q\nwant\n%q", out, tt.want)
			}
		})
	}
	// The error names the columns there are.
	if _, _, errs := vgpuctl("hosts", "-c", "colour", "--url", srv.URL); !strings.Contains(errs, "the columns are name, node, gpus, capacity, used, free") {
		t.Errorf("unknown column: stderr %s", errs)
	}
	// Without -c, json is still the API's answer as sent.
	if _, out, _ := vgpuctl("hosts", "-f", "json", "--url", srv.URL); !strings.Contains(out, `"root_provider_uuid": "rp-1"`) {
		t.Errorf("-f json without -c:\n%s", out)
	}
}
