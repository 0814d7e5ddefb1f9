package foundation

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestEveryRouteRefusesBadInput walks every route of /v1/openapi.json,
// as an administrator, with text that cannot be stored or read: a NUL or
// bytes that are not UTF-8 in each path segment, in a query parameter the
// route takes and in one it does not, and bodies that are not JSON text
// (a NUL escape, invalid UTF-8, a member name twice, text/plain). Each
// answer is the documented refusal as problem+json, never a 5xx. Run
// before the input checks, several of these answered 500 or were served.
func TestEveryRouteRefusesBadInput(t *testing.T) {
	d := start(t, config(t, testsvc.Postgres(t)))
	base := "http://" + d.API.Addr()
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name string `json:"name"`
				In   string `json:"in"`
			} `json:"parameters"`
			RequestBody any `json:"requestBody"`
		} `json:"paths"`
	}
	_, body := get(t, base+"/v1/openapi.json", "")
	testsvc.Must(t, json.Unmarshal([]byte(body), &doc), "openapi.json")
	type probe struct {
		method, path, ct string
		body             []byte
		status           int // 0: any 4xx
		code             string
	}
	var probes []probe
	param := regexp.MustCompile(`\{[^}]+\}`)
	paths := make([]string, 0, len(doc.Paths))
	for p := range doc.Paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		for method, op := range doc.Paths[p] {
			m := strings.ToUpper(method)
			if m != http.MethodGet && m != http.MethodPost && m != http.MethodDelete && m != http.MethodPut && m != http.MethodPatch {
				continue
			}
			plain := param.ReplaceAllString(p, "x")
			if param.MatchString(p) {
				for _, bad := range []string{"a%00b", "a%ffb", "%c3%28"} {
					probes = append(probes, probe{method: m, path: param.ReplaceAllString(p, bad), status: 400, code: "invalid_path"})
				}
			}
			probes = append(probes,
				probe{method: m, path: plain + "?nonsense=1", status: 400, code: "invalid_query"},
				probe{method: m, path: plain + "?x=%00", status: 400, code: "invalid_query"},
				probe{method: m, path: plain + "?%ff=1", status: 400, code: "invalid_query"},
				probe{method: m, path: plain + "?x=%zz", status: 400, code: "invalid_query"})
			for _, q := range op.Parameters {
				if q.In == "query" {
					probes = append(probes,
						probe{method: m, path: plain + "?" + q.Name + "=a%00b", status: 400, code: "invalid_query"},
						probe{method: m, path: plain + "?" + q.Name + "=%fe%ff", status: 400, code: "invalid_query"})
				}
			}
			if m == http.MethodGet || strings.HasPrefix(p, "/v1/webhooks/") {
				continue // webhooks check their own bodies (tests/webhook)
			}
			probes = append(probes,
				probe{method: m, path: plain, ct: "application/json", body: []byte(`{"reason":"a\u0000b"}`), status: 422, code: "invalid_params"},
				probe{method: m, path: plain, ct: "application/json", body: []byte("{\"reason\":\"a\xff\xfeb\"}"), status: 400, code: "invalid_utf8"},
				probe{method: m, path: plain, ct: "application/json", body: []byte(`{"reason":"a","reason":"b"}`), status: 422, code: "invalid_params"},
				probe{method: m, path: plain, ct: "text/plain", body: []byte(`{"reason":"a"}`), status: 415, code: "unsupported_media_type"})
		}
	}
	for _, pr := range probes {
		req, err := http.NewRequest(pr.method, base+pr.path, bytes.NewReader(pr.body))
		if err != nil {
			t.Fatalf("%s %s: %v", pr.method, pr.path, err)
		}
		if pr.body == nil {
			req.Body = http.NoBody
		}
		req.Header.Set("X-Auth-Token", testbridge.AdminToken)
		if pr.ct != "" {
			req.Header.Set("Content-Type", pr.ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", pr.method, pr.path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p struct {
			Code string `json:"code"`
		}
		json.Unmarshal(b, &p)
		switch {
		case resp.StatusCode >= 500:
			t.Errorf("%s %s (%s %q): %d %s", pr.method, pr.path, pr.ct, pr.body, resp.StatusCode, b)
		case resp.StatusCode != pr.status || p.Code != pr.code || resp.Header.Get("Content-Type") != api.ProblemContentType:
			t.Errorf("%s %s (%s %q): %d %s %s; want %d %s as problem+json", pr.method, pr.path, pr.ct, pr.body,
				resp.StatusCode, resp.Header.Get("Content-Type"), b, pr.status, pr.code)
		}
	}
	t.Logf("%d probes over %d paths", len(probes), len(paths))
}

// TestHeaderTooLarge431: a header over [api] max_header_bytes is refused
// with problem+json (Go's own answer is text/plain).
func TestHeaderTooLarge431(t *testing.T) {
	d := start(t, config(t, testsvc.Postgres(t), "api.max_header_bytes=8192"))
	req, _ := http.NewRequest(http.MethodGet, "http://"+d.API.Addr()+"/healthz", nil)
	req.Header.Set("X-Padding", strings.Repeat("a", 20000))
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(t, err, "GET")
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || resp.Header.Get("Content-Type") != api.ProblemContentType ||
		!strings.Contains(string(b), `"header_too_large"`) {
		t.Errorf("answer %d %s %s, want 431 problem+json header_too_large", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
}
