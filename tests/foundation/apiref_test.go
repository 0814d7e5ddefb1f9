package foundation

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

var update = flag.Bool("update", false, "rewrite doc/source/reference/api.rst from the served OpenAPI document")

const apiRef = "../../doc/source/reference/api.rst"

// TestAPIReference: the documentation's API reference is the OpenAPI
// document a running bridge serves, rendered; -update rewrites it.
func TestAPIReference(t *testing.T) {
	d := start(t, config(t, testsvc.Postgres(t)))
	code, body := get(t, "http://"+d.API.Addr()+"/v1/openapi.json", "")
	if code != 200 {
		t.Fatalf("openapi.json: %d", code)
	}
	got, err := renderAPI([]byte(body))
	testsvc.Must(t, err, "render")
	if *update {
		testsvc.Must(t, os.WriteFile(apiRef, got, 0o644), "write "+apiRef)
		return
	}
	want, err := os.ReadFile(apiRef)
	testsvc.Must(t, err, "read "+apiRef)
	if string(got) != string(want) {
		t.Errorf("%s is not the served OpenAPI document's rendering; run go test ./tests/foundation -run TestAPIReference -update", apiRef)
	}
}

// renderAPI renders an OpenAPI 3 document as reStructuredText: one
// section per path and method, with its summary, description, parameters
// and answers.
func renderAPI(raw []byte) ([]byte, error) {
	type param struct {
		Ref         string `json:"$ref"`
		Name        string `json:"name"`
		In          string `json:"in"`
		Required    bool   `json:"required"`
		Description string `json:"description"`
	}
	var doc struct {
		Info struct {
			Title string `json:"title"`
		} `json:"info"`
		Components struct {
			Parameters map[string]param `json:"parameters"`
		} `json:"components"`
		Paths map[string]map[string]struct {
			Summary     string   `json:"summary"`
			Description string   `json:"description"`
			Tags        []string `json:"tags"`
			Parameters  []param  `json:"parameters"`
			Responses   map[string]struct {
				Description string `json:"description"`
				Ref         string `json:"$ref"`
			} `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	esc := strings.NewReplacer(`\`, `\\`, "*", `\*`, "`", "\\`", "_", `\_`, "|", `\|`)
	text := func(s string) string { return esc.Replace(strings.Join(strings.Fields(s), " ")) }
	var b strings.Builder
	b.WriteString("..\n   Generated from the bridge's GET /v1/openapi.json by\n   go test ./tests/foundation -run TestAPIReference -update; do not edit.\n\n")
	title := "API reference"
	fmt.Fprintf(&b, "%s\n%s\n\n", title, strings.Repeat("=", len(title)))
	b.WriteString("Every route of the operator API, as ``GET /v1/openapi.json`` describes it. Errors are\n``application/problem+json`` (RFC 9457).\n")
	paths := make([]string, 0, len(doc.Paths))
	for p := range doc.Paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	order := map[string]int{"get": 0, "post": 1, "put": 2, "patch": 3, "delete": 4}
	for _, p := range paths {
		methods := make([]string, 0, len(doc.Paths[p]))
		for m := range doc.Paths[p] {
			if _, ok := order[m]; ok {
				methods = append(methods, m)
			}
		}
		sort.Slice(methods, func(i, j int) bool { return order[methods[i]] < order[methods[j]] })
		for _, m := range methods {
			op := doc.Paths[p][m]
			head := strings.ToUpper(m) + " " + p
			fmt.Fprintf(&b, "\n``%s``\n%s\n\n", head, strings.Repeat("-", len(head)+4))
			if op.Summary != "" {
				b.WriteString(text(op.Summary) + "\n")
			}
			if op.Description != "" {
				b.WriteString("\n" + text(op.Description) + "\n")
			}
			if len(op.Parameters) > 0 {
				b.WriteString("\nParameters:\n\n")
				for _, pa := range op.Parameters {
					if pa.Ref != "" {
						pa = doc.Components.Parameters[pa.Ref[strings.LastIndex(pa.Ref, "/")+1:]]
					}
					req := ""
					if pa.Required {
						req = ", required"
					}
					fmt.Fprintf(&b, "* ``%s`` (%s%s)", pa.Name, pa.In, req)
					if pa.Description != "" {
						b.WriteString(": " + text(pa.Description))
					}
					b.WriteString("\n")
				}
			}
			if len(op.Responses) > 0 {
				codes := make([]string, 0, len(op.Responses))
				for c := range op.Responses {
					codes = append(codes, c)
				}
				sort.Strings(codes)
				b.WriteString("\nAnswers:\n\n")
				for _, c := range codes {
					r := op.Responses[c]
					d := r.Description
					if d == "" && r.Ref != "" {
						d = "see " + r.Ref[strings.LastIndex(r.Ref, "/")+1:]
					}
					fmt.Fprintf(&b, "* ``%s``: %s\n", c, text(d))
				}
			}
		}
	}
	return []byte(b.String()), nil
}
