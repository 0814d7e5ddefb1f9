package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// The checks every request passes before its handler: the header limit,
// the path and the query as text, the query's parameter names against the
// route's OpenAPI description, and (for routes the server authenticates)
// a body's media type and text. Each refusal is problem+json naming what
// is wrong; none reaches a handler or the database.

// headerBytes is what a request's header takes, counted as on the wire.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.URL.RequestURI()) + len(r.Proto) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n + len(r.Host) + len("Host: \r\n")
}

// badText says why s cannot be taken as text: not UTF-8, or a NUL.
func badText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "holds a NUL character"
	}
	return ""
}

// inputMW refuses requests whose header is over the limit (431), whose
// path or query is not text (400), or whose query names a parameter the
// route does not take (400).
func (s *Server) inputMW(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if limit := s.headerLimit(); headerBytes(r) > limit {
			return &ProblemDetails{Status: http.StatusRequestHeaderFieldsTooLarge, Code: "header_too_large",
				Detail: fmt.Sprintf("the request's header may hold at most %d bytes", limit), Headers: map[string]string{"Connection": "close"}}
		}
		if why := badText(r.URL.Path); why != "" {
			return &ProblemDetails{Status: http.StatusBadRequest, Code: "invalid_path", Detail: "the path " + why}
		}
		q, err := queryValues(r.URL.RawQuery)
		if err != nil {
			return &ProblemDetails{Status: http.StatusBadRequest, Code: "invalid_query", Detail: "the query string: " + err.Error()}
		}
		var bad []InvalidParam
		for k, vs := range q {
			if why := badText(k); why != "" {
				bad = append(bad, InvalidParam{Name: strconv.Quote(k), Reason: "the name " + why})
				continue
			}
			for _, v := range vs {
				if why := badText(v); why != "" {
					bad = append(bad, InvalidParam{Name: k, Reason: "the value " + why})
				}
			}
		}
		if len(bad) == 0 && len(q) > 0 {
			method := r.Method
			if method == http.MethodHead {
				method = http.MethodGet
			}
			if known, ok := s.queryParams(method, c.Path()); ok {
				for k := range q {
					if !known[k] {
						bad = append(bad, InvalidParam{Name: k, Reason: "unknown query parameter" + knownList(known)})
					}
				}
			}
		}
		if len(bad) > 0 {
			sort.Slice(bad, func(i, j int) bool { return bad[i].Name < bad[j].Name })
			return &ProblemDetails{Status: http.StatusBadRequest, Code: "invalid_query", Detail: fmt.Sprintf("%d invalid query parameter(s)", len(bad)),
				InvalidParams: bad}
		}
		return next(c)
	}
}

func knownList(known map[string]bool) string {
	if len(known) == 0 {
		return "; this route takes none"
	}
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	sort.Strings(names)
	return "; this route takes " + strings.Join(names, ", ")
}

// queryValues parses a raw query like url.ParseQuery, but fails on the
// first malformed escape instead of dropping the pair.
func queryValues(raw string) (map[string][]string, error) {
	out := map[string][]string{}
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		if strings.Contains(pair, ";") {
			return nil, errors.New("';' does not separate parameters; use '&'")
		}
		k, v, _ := strings.Cut(pair, "=")
		k, err := queryUnescape(k)
		if err != nil {
			return nil, err
		}
		v, err = queryUnescape(v)
		if err != nil {
			return nil, err
		}
		out[k] = append(out[k], v)
	}
	return out, nil
}

func queryUnescape(s string) (string, error) {
	u, err := url.QueryUnescape(s)
	if err != nil {
		return "", fmt.Errorf("bad escape in %q", s)
	}
	return u, nil
}

// queryParams returns the query parameters the OpenAPI document gives the
// route (echo's path form); false when the route is not described.
func (s *Server) queryParams(method, route string) (map[string]bool, bool) {
	key := method + " " + route
	s.qpMu.Lock()
	defer s.qpMu.Unlock()
	if s.qp == nil {
		s.qp = s.loadQueryParams()
	}
	known, ok := s.qp[key]
	return known, ok
}

// loadQueryParams reads the query parameters of every described route.
func (s *Server) loadQueryParams() map[string]map[string]bool {
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Parameters map[string]openapiParam `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(s.Document(), &doc); err != nil {
		panic(err)
	}
	resolve := func(p openapiParam) openapiParam {
		if name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/"); ok {
			return doc.Components.Parameters[name]
		}
		return p
	}
	out := map[string]map[string]bool{}
	for _, r := range s.e.Routes() {
		item, ok := doc.Paths[OpenAPIPath(r.Path)]
		if !ok {
			continue
		}
		raw, ok := item[strings.ToLower(r.Method)]
		if !ok {
			continue
		}
		var op struct {
			Parameters []openapiParam `json:"parameters"`
		}
		var shared struct {
			Parameters []openapiParam `json:"parameters"`
		}
		_ = json.Unmarshal(raw, &op)
		if pr, ok := item["parameters"]; ok {
			_ = json.Unmarshal(pr, &shared.Parameters)
		}
		known := map[string]bool{}
		for _, p := range append(shared.Parameters, op.Parameters...) {
			if p = resolve(p); p.In == "query" {
				known[p.Name] = true
			}
		}
		out[r.Method+" "+r.Path] = known
	}
	return out
}

type openapiParam struct {
	Ref  string `json:"$ref"`
	Name string `json:"name"`
	In   string `json:"in"`
}

// bodyMW checks the body of a request to a route the server
// authenticates: a body must be JSON (415 otherwise), valid UTF-8 (400),
// without an escaped NUL, which Postgres cannot store, and without a
// member name twice in one object (422). It reads the body, bounded by
// bodyLimitMW, and hands the handler the same bytes.
func bodyMW(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			return next(c)
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return Problem(http.StatusRequestEntityTooLarge, "Request Entity Too Large",
					fmt.Sprintf("the body may hold at most %d bytes", mbe.Limit))
			}
			return &ProblemDetails{Status: http.StatusBadRequest, Code: "body_unreadable", Detail: "the body could not be read"}
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		if len(b) == 0 {
			return next(c)
		}
		if !IsJSONMediaType(r.Header.Get(echo.HeaderContentType)) {
			return &ProblemDetails{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
				Detail: "send the body as JSON, with Content-Type: application/json"}
		}
		if bad := CheckJSONText(b); bad != nil {
			return bad
		}
		return next(c)
	}
}

// IsJSONMediaType reports whether a Content-Type names JSON
// (application/json, or a +json type, with any parameters).
func IsJSONMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// CheckJSONText refuses a JSON body Go would read but should not: bytes
// that are not UTF-8 (400: Go would replace them silently), an escaped
// NUL (422: Postgres's jsonb cannot store it) or a member name twice in
// one object (422: which one counts is up to the reader). nil when none;
// the body's JSON syntax is left to the decoder.
func CheckJSONText(body []byte) *ProblemDetails {
	if !utf8.Valid(body) {
		return &ProblemDetails{Status: http.StatusBadRequest, Code: "invalid_utf8", Detail: "the body is not valid UTF-8"}
	}
	var bad []InvalidParam
	if HasNULEscape(body) {
		bad = append(bad, InvalidParam{Name: "(body)", Reason: `must not contain \u0000`})
	}
	if path, ok := DuplicateKey(body); ok {
		bad = append(bad, InvalidParam{Name: path, Reason: "appears more than once in its object"})
	}
	if len(bad) > 0 {
		return ValidationProblem(bad)
	}
	return nil
}

// HasNULEscape reports whether a JSON text holds an escaped NUL (\u0000).
// `\\u0000` (an escaped backslash, then the letters u0000) is not one: the
// escape is a NUL only when an odd number of backslashes leads to it.
func HasNULEscape(body []byte) bool {
	for off := 0; ; {
		i := bytes.Index(body[off:], []byte(`\u0000`))
		if i < 0 {
			return false
		}
		i += off
		n := 0
		for j := i; j >= 0 && body[j] == '\\'; j-- {
			n++
		}
		if n%2 == 1 {
			return true
		}
		off = i + 1
	}
}

// DuplicateKey returns the path of the first object member whose name
// came before in the same object ("metrics.util", "alerts[2].labels.x");
// false when there is none or the text is not JSON. It scans the bytes
// once, allocating only for names with escapes and for large objects.
func DuplicateKey(body []byte) (string, bool) {
	if bytes.IndexByte(body, '{') < 0 || !json.Valid(body) {
		return "", false
	}
	var stack []*jsonFrame
	wantName := false
	for i := 0; i < len(body); {
		switch body[i] {
		case '{':
			stack = append(stack, &jsonFrame{obj: true})
			wantName = true
			i++
		case '[':
			stack = append(stack, &jsonFrame{})
			wantName = false
			i++
		case '}', ']':
			stack = stack[:len(stack)-1]
			wantName = false
			i++
		case ',':
			if f := stack[len(stack)-1]; f.obj {
				wantName = true
			} else {
				f.index++
			}
			i++
		case '"':
			j := i + 1
			escaped := false
			for body[j] != '"' {
				if body[j] == '\\' {
					escaped = true
					j++
				}
				j++
			}
			if len(stack) > 0 && wantName && stack[len(stack)-1].obj {
				f := stack[len(stack)-1]
				name := body[i+1 : j]
				if escaped {
					var s string
					_ = json.Unmarshal(body[i:j+1], &s)
					name = []byte(s)
				}
				f.name = name
				if f.seen(name) {
					return namePath(stack), true
				}
				wantName = false
			}
			i = j + 1
		default:
			i++
		}
	}
	return "", false
}

// jsonFrame is an array or object DuplicateKey is inside.
type jsonFrame struct {
	obj   bool
	names [][]byte            // the object's names so far, while few
	set   map[string]struct{} // all of them, once there are many
	name  []byte              // the current member's name
	index int                 // the current element of an array
}

// seen reports whether the object had name already, and adds it.
func (f *jsonFrame) seen(name []byte) bool {
	if f.set != nil {
		if _, ok := f.set[string(name)]; ok {
			return true
		}
		f.set[string(name)] = struct{}{}
		return false
	}
	for _, n := range f.names {
		if bytes.Equal(n, name) {
			return true
		}
	}
	if f.names = append(f.names, name); len(f.names) > 32 {
		f.set = make(map[string]struct{}, 64)
		for _, n := range f.names {
			f.set[string(n)] = struct{}{}
		}
		f.names = nil
	}
	return false
}

// namePath names the current member of the innermost object of stack.
func namePath(stack []*jsonFrame) string {
	var b strings.Builder
	for _, f := range stack {
		if f.obj {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.Write(f.name)
		} else {
			fmt.Fprintf(&b, "[%d]", f.index)
		}
	}
	return b.String()
}
