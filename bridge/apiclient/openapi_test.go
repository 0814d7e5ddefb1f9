package apiclient

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestTypesMatchOpenAPI checks the client's wire types against the
// schemas of /v1/openapi.json, which the server packages serve from their
// openapi.json files, both ways: every field the client reads is a
// property of the schema, of the same JSON type, and every property of
// the schema is a field of the client's type or listed in unread (with
// why). Structs nested in a field are checked against the property's
// schema the same way; the list envelopes are checked against their GET
// operation's answer. Types the client shares with the server (the
// …wire packages) are checked too, for what the client adds. Every struct
// of the package with JSON fields is checked, or listed in notInSchemas.
func TestTypesMatchOpenAPI(t *testing.T) {
	schemas := map[string]map[string]any{}
	gets := map[string]map[string]any{} // GET path → its 200 answer's schema
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
			Paths      map[string]map[string]operation `json:"paths"`
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
		for path, ops := range doc.Paths {
			if op, ok := ops["get"]; ok {
				gets[path] = op.Responses["200"].Content["application/json"].Schema
			}
		}
	}
	c := &checker{schemas: schemas, checked: map[string]bool{}, unreadSeen: map[string]bool{}}
	ran, subtests := 0, 0 // the completeness checks need every type's run
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
		{Problem{}, []string{"Problem"}},
		{FleetUpgradeBody{}, []string{"FleetUpgradeBody"}},
		{FleetUpgrade{}, []string{"FleetUpgrade"}},
		{FleetUpgradePlan{}, []string{"FleetUpgradePlan"}},
		{FleetRetypeBody{}, []string{"FleetRetypeBody"}},
		{FleetRetypePlan{}, []string{"FleetRetypePlan"}},
		{NovaConfChange{}, []string{"NovaConfChange"}},
	} {
		typ := reflect.TypeOf(tc.value)
		subtests++
		t.Run(typ.Name(), func(t *testing.T) {
			ran++
			var parts []map[string]any
			for _, name := range tc.schema {
				s, ok := schemas[name]
				if !ok {
					t.Fatalf("no schema %s in /v1/openapi.json", name)
				}
				parts = append(parts, s)
			}
			c.check(t, typ, strings.Join(tc.schema, "+"), parts...)
		})
	}
	// The list envelopes are inline in their operation's answer.
	for _, tc := range []struct {
		value any
		path  string
	}{
		{HostList{}, "/v1/hosts"},
		{GPUList{}, "/v1/gpus"},
		{AllocationList{}, "/v1/allocations"},
		{InstanceList{}, "/v1/instances"},
		{EventList{}, "/v1/events"},
		{DeadLetterList{}, "/v1/dead-letters"},
		{RequestList{}, "/v1/requests"},
		{AuditList{}, "/v1/audit"},
		{ProfileList{}, "/v1/profiles"},
	} {
		typ := reflect.TypeOf(tc.value)
		subtests++
		t.Run(typ.Name(), func(t *testing.T) {
			ran++
			s := gets[tc.path]
			if s == nil {
				t.Fatalf("no JSON answer of GET %s in /v1/openapi.json", tc.path)
			}
			c.check(t, typ, "GET "+tc.path, s)
		})
	}
	t.Run("unread", func(t *testing.T) {
		if ran < subtests {
			t.Skip("a -run filter left types out")
		}
		for typ, props := range unread {
			for _, p := range props {
				if !c.unreadSeen[typ+"."+p] {
					t.Errorf("unread lists %s.%s, which the check never met (the client reads it now, or the schema lost it)", typ, p)
				}
			}
		}
	})
	t.Run("unsent", func(t *testing.T) {
		if ran < subtests {
			t.Skip("a -run filter left types out")
		}
		for path, fields := range unsent {
			for _, f := range fields {
				if !c.unreadSeen["unsent "+path+"."+f] {
					t.Errorf("unsent lists %s.%s, which the check never met (the schema has it now, or the client lost it)", path, f)
				}
			}
		}
	})
	t.Run("every type", func(t *testing.T) {
		if ran < subtests {
			t.Skip("a -run filter left types out")
		}
		for _, name := range packageWireTypes(t) {
			_, skip := notInSchemas[name]
			switch {
			case c.checked[name] && skip:
				t.Errorf("%s is checked: take it out of notInSchemas", name)
			case !c.checked[name] && !skip:
				t.Errorf("%s has JSON fields but no schema checks it: add it to the table (or nest it in a checked type), or to notInSchemas with why", name)
			}
		}
	})
}

// unread are the properties of a schema that the client's type leaves
// out, by the type's name: the answers keep them in Raw for callers that
// re-emit the answer, and the request bodies do not send them.
var unread = map[string][]string{
	// vgpuctl prints an explanation's text and intents' summary; the
	// rest of a decision is in Raw (vgpuctl policy explain -o json).
	"Explanation": {"held", "load_updates", "other_rules", "policy", "preferred", "preferred_why", "project_id",
		"refused", "rules", "time"},
	"Intent": {"clocks_mhz", "cpu_max", "excluded_hosts", "frame_rate_limit", "gpus", "memory_high", "message",
		"scheduler", "timeslice_us", "trait", "type_id", "why"},
	"PolicyReplaySide": {"held"},
	// Drain joins the host's and the GPU's answers; a GPU's fault is in Raw.
	"Drain": {"fault_reason", "faulted_at"},
	// A profile's MIG slices are in Raw (vgpuctl profiles -o json).
	"Profile":             {"mig_slices"},
	"PolicyReplayEvent":   {"project_id", "received_at", "source"},
	"PolicyReplaySummary": {"active_policy", "candidate_policy", "failures", "rule_errors", "since", "until"},
	// The problem's extension members that vgpuctl does not show: Raw.
	"Problem":          {"first_request_id", "policy_rule", "status_url"},
	"FleetUpgradeHost": {"drained_by_operation", "gate_command", "seq"},
	"NovaConfChange":   {"mdev_sections"},
	"FleetUpgradePlan": {"options"},
	"FleetRetypePlan":  {"options"},
	// Request bodies: what the client does not send.
	"DryRunRequest": {"exclude_gpus"},
	"NewRequest":    {"callback_url", "event_id", "guest_driver", "metrics", "nonce", "timestamp", "tune"},
}

// unsent are the fields of the client's type that the server never sends
// where the schema path uses the type, by path, with why.
var unsent = map[string][]string{
	// A dry run's plan lists MaintenanceVMPlan items, which the client
	// decodes into MaintenanceVM: the run's fields stay empty.
	"MigrateAllDryRun.plan.vms": {"migration_uuid", "reservation_consumer", "state", "updated_at"},
}

// notInSchemas are the package's structs with JSON fields that no
// schema of /v1/openapi.json describes, with why (none today).
var notInSchemas = map[string]string{}

// operation is the part of an OpenAPI operation the check reads.
type operation struct {
	Responses map[string]struct {
		Content map[string]struct {
			Schema map[string]any `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

// checker checks client types against schemas, and records what it
// checked.
type checker struct {
	schemas    map[string]map[string]any
	checked    map[string]bool // type names
	unreadSeen map[string]bool // Type.property of unread, "unsent "+path.field of unsent
}

// check compares typ's JSON fields with the properties of parts (joined),
// both ways, and the structs of its fields with the properties' schemas.
func (c *checker) check(t *testing.T, typ reflect.Type, what string, parts ...map[string]any) {
	t.Helper()
	c.checked[typ.Name()] = true
	props := map[string]map[string]any{}
	for _, s := range parts {
		for p, v := range objectProps(c.schemas, s) {
			props[p] = v
		}
	}
	fields := jsonFields(typ)
	skip := map[string]bool{}
	for _, p := range unread[typ.Name()] {
		skip[p] = true
	}
	for p := range props {
		if _, ok := fields[p]; ok {
			continue
		}
		if skip[p] {
			c.unreadSeen[typ.Name()+"."+p] = true
			continue
		}
		t.Errorf("%s: property %q of schema %s is not a field of the client (read it, or list it in unread with why)", typ, p, what)
	}
	notSent := map[string]bool{}
	for _, f := range unsent[what] {
		notSent[f] = true
	}
	for name, ft := range fields {
		p, ok := props[name]
		if !ok && notSent[name] {
			c.unreadSeen["unsent "+what+"."+name] = true
			continue
		}
		if !ok {
			t.Errorf("%s: field %q (%s) is not in schema %s", typ, name, ft, what)
			continue
		}
		if want, got := schemaType(c.schemas, p), jsonType(ft); want != "" && got != "" && want != got {
			t.Errorf("%s: field %q: client reads %s (%s), schema says %s", typ, name, got, ft, want)
		}
		if st, ps := c.nested(ft, p); st != nil && len(objectProps(c.schemas, ps)) > 0 {
			c.check(t, st, what+"."+name, ps)
		}
	}
}

// nested is the struct a field of Go type ft holds (itself, or the items
// of a slice or map) and the schema of that struct in p; nil when ft holds
// no struct of its own (time.Time is a string).
func (c *checker) nested(ft reflect.Type, p map[string]any) (reflect.Type, map[string]any) {
	p = c.deref(p)
	for {
		switch ft.Kind() {
		case reflect.Pointer:
			ft = ft.Elem()
			continue
		case reflect.Slice, reflect.Array:
			items, _ := p["items"].(map[string]any)
			ft, p = ft.Elem(), c.deref(items)
			continue
		case reflect.Map:
			items, _ := p["additionalProperties"].(map[string]any)
			ft, p = ft.Elem(), c.deref(items)
			continue
		case reflect.Struct:
			if ft == timeType || ft.Name() == "" && ft.NumField() == 0 || p == nil {
				return nil, nil
			}
			return ft, p
		}
		return nil, nil
	}
}

// deref is the schema p refers to, or p.
func (c *checker) deref(p map[string]any) map[string]any {
	if ref, ok := p["$ref"].(string); ok {
		return c.schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
	}
	return p
}

// packageWireTypes are the names of the package's struct types with a
// JSON-tagged field (its non-test files).
func packageWireTypes(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, spec := range g.Specs {
				ts := spec.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok || ts.Assign != 0 {
					continue
				}
				for _, fl := range st.Fields.List {
					if fl.Tag != nil && strings.Contains(fl.Tag.Value, `json:"`) {
						out = append(out, ts.Name.Name)
						break
					}
				}
			}
		}
	}
	return out
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
