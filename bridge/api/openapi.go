package api

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

//go:embed openapi.json
var foundationFragment []byte

func baseDocument(version string) map[string]any {
	if version == "" {
		version = "dev"
	}
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{
			"title":       "vgpu-bridge operator API",
			"version":     version,
			"description": "Elastic, policy-driven NVIDIA vGPU for OpenStack. Errors are application/problem+json (RFC 9457).",
		},
		"paths":      map[string]any{},
		"components": map[string]any{"schemas": map[string]any{}, "securitySchemes": map[string]any{}},
	}
}

// Describe merges an OpenAPI fragment ({"paths": …, "components": …}) into
// the served document. It panics on malformed JSON or on a path+method
// described twice: both are programming errors caught by tests.
func (s *Server) Describe(fragment []byte) {
	var frag map[string]any
	if err := json.Unmarshal(fragment, &frag); err != nil {
		panic(fmt.Sprintf("api: bad OpenAPI fragment: %v", err))
	}
	s.qpMu.Lock()
	s.qp = nil // read again with this fragment (input.go)
	s.qpMu.Unlock()
	s.docMu.Lock()
	defer s.docMu.Unlock()
	paths := s.doc["paths"].(map[string]any)
	if fp, ok := frag["paths"].(map[string]any); ok {
		for p, ops := range fp {
			cur, _ := paths[p].(map[string]any)
			if cur == nil {
				cur = map[string]any{}
				paths[p] = cur
			}
			for m, op := range ops.(map[string]any) {
				if _, dup := cur[m]; dup {
					panic(fmt.Sprintf("api: %s %s described twice", strings.ToUpper(m), p))
				}
				cur[m] = op
			}
		}
	}
	comps := s.doc["components"].(map[string]any)
	if fc, ok := frag["components"].(map[string]any); ok {
		for kind, items := range fc {
			cur, _ := comps[kind].(map[string]any)
			if cur == nil {
				cur = map[string]any{}
				comps[kind] = cur
			}
			for name, item := range items.(map[string]any) {
				cur[name] = item
			}
		}
	}
}

// Document returns the OpenAPI document as JSON.
// Each operation carries the access class of its route (x-vgpu-access:
// public, project, fleet, admin or custom; see Access), taken from its
// registration, so the contract the document states is the one enforced,
// and the name of the access rule that guards it (x-vgpu-policy), which
// [oslo_policy] policy_file may override.
func (s *Server) Document() []byte {
	s.docMu.Lock()
	defer s.docMu.Unlock()
	paths, _ := s.doc["paths"].(map[string]any)
	for key, a := range s.access {
		method, path, _ := strings.Cut(key, " ")
		ops, _ := paths[path].(map[string]any)
		if op, ok := ops[method].(map[string]any); ok {
			op["x-vgpu-access"] = a.String()
			if r := s.rules[key]; r != "" {
				op["x-vgpu-policy"] = r
			}
		}
	}
	b, err := json.MarshalIndent(s.doc, "", "  ")
	if err != nil {
		panic(err)
	}
	return b
}

func (s *Server) openapi(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, s.Document())
}

// OpenAPIPath turns an echo route path (/v1/requests/:id) into OpenAPI's
// form (/v1/requests/{id}).
func OpenAPIPath(p string) string {
	parts := strings.Split(p, "/")
	for i, part := range parts {
		if strings.HasPrefix(part, ":") {
			parts[i] = "{" + part[1:] + "}"
		}
	}
	return strings.Join(parts, "/")
}

// Undescribed lists the registered routes that the document does not
// describe, as "METHOD /path".
func (s *Server) Undescribed() []string {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(s.Document(), &doc); err != nil {
		panic(err)
	}
	var out []string
	for _, r := range s.e.Routes() {
		if r.Method == echo.RouteNotFound || strings.HasSuffix(r.Path, "/*") {
			continue
		}
		p := OpenAPIPath(r.Path)
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet // HEAD is GET without the body (Handle)
		}
		if _, ok := doc.Paths[p][strings.ToLower(method)]; !ok {
			out = append(out, r.Method+" "+p)
		}
	}
	return out
}
