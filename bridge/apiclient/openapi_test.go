package apiclient

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestTypesMatchOpenAPI checks the client's wire types against the
// schemas of /v1/openapi.json, which the server packages serve from their
// openapi.json files: every field the client reads is a property of the
// schema, of the same JSON type. Types the client shares with the server
// (the …wire packages) are checked too, for what the client adds.
func TestTypesMatchOpenAPI(t *testing.T) {
	schemas := map[string]map[string]any{}
	files, err := filepath.Glob("../*/openapi.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no openapi.json beside apiclient: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Components struct {
				Schemas map[string]map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for k, v := range doc.Components.Schemas {
			schemas[k] = v
		}
	}
	for _, tc := range []struct {
		value  any
		schema []string // the client's type may join several (drain answers)
	}{
		{Readiness{}, []string{"Readiness"}},
		{Host{}, []string{"Host"}},
		{HostReport{}, []string{"HostReport"}},
		{GPU{}, []string{"GPU"}},
		{Instance{}, []string{"Instance"}},
		{Request{}, []string{"Request"}},
		{Event{}, []string{"Event"}},
		{DeadLetter{}, []string{"DeadLetter"}},
		{Allocation{}, []string{"VGPUAllocation"}},
		{DryRunRequest{}, []string{"DryRunRequest"}},
		{Candidate{}, []string{"Candidate"}},
		{DryRunResponse{}, []string{"DryRunResponse"}},
		{Intent{}, []string{"PolicyIntent"}},
		{WebhookAnswer{}, []string{"WebhookAccepted"}},
		{SyncResult{}, []string{"SyncResult"}},
		{RetypeResult{}, []string{"RetypeResult"}},
		{Controls{}, []string{"Controls"}},
		{Drain{}, []string{"HostDrain", "GPUDrain"}},
		{Profile{}, []string{"ProfileRecord"}},
		{ReplayResult{}, []string{"ReplayAnswer"}},
		{DriftList{}, []string{"DriftAnswer"}},
		{UsageReport{}, []string{"UsageReport"}},
		{MigrateAll{}, []string{"MigrateAllBody"}},
		{MaintenanceOperation{}, []string{"MaintenanceOperation"}},
		{MaintenanceVM{}, []string{"MaintenanceVM"}},
		{MaintenanceStep{}, []string{"MaintenanceStep"}},
		{MaintenancePlan{}, []string{"MigrateAllDryRun"}},
		{DriftRun{}, []string{"DriftRun"}},
		{DriftFinding{}, []string{"DriftFinding"}},
		{Explanation{}, []string{"PolicyDecision"}},
		{PolicyReplayRequest{}, []string{"PolicyReplayRequest"}},
		{PolicyReplaySide{}, []string{"PolicyReplaySide"}},
		{PolicyReplay{}, []string{"PolicyReplay"}},
		{NewRequest{}, []string{"WebhookNative"}},
		{Diagnostics{}, []string{"Diagnostics"}},
		{AuditRecord{}, []string{"AuditRecord"}},
		{UsageRow{}, []string{"UsageRow"}},
		{Quota{}, []string{"QuotaView"}},
		{PolicyQuota{}, []string{"PolicyQuota"}},
		{QuotaLimit{}, []string{"QuotaLimit"}},
	} {
		typ := reflect.TypeOf(tc.value)
		t.Run(typ.Name(), func(t *testing.T) {
			props := map[string]map[string]any{}
			for _, name := range tc.schema {
				s, ok := schemas[name]
				if !ok {
					t.Fatalf("no schema %s in /v1/openapi.json", name)
				}
				for p, v := range objectProps(schemas, s) {
					props[p] = v
				}
			}
			for name, ft := range jsonFields(typ) {
				p, ok := props[name]
				if !ok {
					t.Errorf("field %q (%s) is not in schema %s", name, ft, strings.Join(tc.schema, "+"))
					continue
				}
				if want, got := schemaType(schemas, p), jsonType(ft); want != "" && got != "" && want != got {
					t.Errorf("field %q: client reads %s (%s), schema says %s", name, got, ft, want)
				}
			}
		})
	}
}

// objectProps are the properties of an object schema, those of its
// allOf/oneOf/anyOf parts and references included.
func objectProps(schemas map[string]map[string]any, s map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	if ref, ok := s["$ref"].(string); ok {
		s = schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
	}
	if ps, ok := s["properties"].(map[string]any); ok {
		for k, v := range ps {
			if m, ok := v.(map[string]any); ok {
				out[k] = m
			}
		}
	}
	for _, key := range []string{"allOf", "oneOf", "anyOf"} {
		if parts, ok := s[key].([]any); ok {
			for _, p := range parts {
				if m, ok := p.(map[string]any); ok {
					for k, v := range objectProps(schemas, m) {
						out[k] = v
					}
				}
			}
		}
	}
	return out
}

// schemaType is the JSON type a property's schema names ("" when it does
// not say one).
func schemaType(schemas map[string]map[string]any, p map[string]any) string {
	if ref, ok := p["$ref"].(string); ok {
		s := schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
		if s == nil {
			return ""
		}
		if _, ok := s["type"]; !ok {
			if _, ok := s["properties"]; ok {
				return "object"
			}
		}
		p = s
	}
	switch v := p["type"].(type) {
	case string:
		return v
	case []any:
		for _, x := range v {
			if s, ok := x.(string); ok && s != "null" {
				return s
			}
		}
	}
	return ""
}

// jsonFields are the JSON names and Go types of a struct's fields,
// embedded structs' included.
func jsonFields(typ reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

var (
	rawType  = reflect.TypeOf(json.RawMessage(nil))
	timeType = reflect.TypeOf(time.Time{})
)

// jsonType is the JSON type a Go type decodes ("" for raw JSON).
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == rawType:
		return ""
	case t == timeType:
		return "string"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Struct, reflect.Map:
		return "object"
	}
	return ""
}
