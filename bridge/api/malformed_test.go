package api

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestHEADAndMalformedRequestsAreProblems: HEAD is GET without the body
// where a GET exists, and a 405 with Allow and problem+json headers where
// none does; requests net/http refuses before any handler (a control
// character in a header value, a space in a header name, a bad
// Content-Length or Host) are answered problem+json with code
// malformed_request and their status, not Go's plain text.
func TestHEADAndMalformedRequestsAreProblems(t *testing.T) {
	s := newTestServer(t, NoAuth{})
	s.cfg.Listen = "127.0.0.1:0"
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	base := "http://" + s.Addr()

	req, _ := http.NewRequest(http.MethodHead, base+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("HEAD /healthz: %d %q, want GET's status and type", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	req, _ = http.NewRequest(http.MethodHead, base+"/v1/things", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Content-Type") != ProblemContentType ||
		!strings.Contains(resp.Header.Get("Allow"), http.MethodPost) {
		t.Errorf("HEAD of a POST-only route: %d %q Allow %q, want 405 problem+json with Allow", resp.StatusCode,
			resp.Header.Get("Content-Type"), resp.Header.Get("Allow"))
	}
	req, _ = http.NewRequest(http.MethodPut, base+"/healthz", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Content-Type") != ProblemContentType ||
		!strings.Contains(resp.Header.Get("Allow"), http.MethodHead) || !strings.Contains(string(b), `"code":"method_not_allowed"`) {
		t.Errorf("PUT /healthz: %d %q Allow %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Allow"), b)
	}

	for name, raw := range map[string]string{
		"control character in a value": "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Trace: a\x01b\r\n\r\n",
		"space in a name":              "GET /healthz HTTP/1.1\r\nHost: x\r\nX Trace: ab\r\n\r\n",
		"bad Content-Length":           "POST /v1/things HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
		"bad Host":                     "GET /healthz HTTP/1.1\r\nHost: x y\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte(raw)) //nolint:errcheck
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var p ProblemDetails
			err = json.NewDecoder(resp.Body).Decode(&p)
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != ProblemContentType ||
				err != nil || p.Code != "malformed_request" || p.Status != http.StatusBadRequest || p.Detail == "" {
				t.Errorf("%d %q %+v (%v), want 400 problem+json malformed_request", resp.StatusCode, resp.Header.Get("Content-Type"), p, err)
			}
		})
	}
}

// TestRewriteGoErrorLeavesHandlerAnswers: only net/http's own refusals
// are rewritten, never an answer a handler wrote (net/http puts Date
// first in those).
func TestRewriteGoErrorLeavesHandlerAnswers(t *testing.T) {
	for _, b := range []string{
		"HTTP/1.1 400 Bad Request\r\nDate: Sun, 06 Dec 2026 04:17:03 GMT\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n",
		"garbage",
	} {
		if _, ok := rewriteGoError([]byte(b)); ok {
			t.Errorf("rewrote %q", b)
		}
	}
	for _, b := range []string{
		"HTTP/1.1 431 Request Header Fields Too Large" + goErrorHeaders + "431 Request Header Fields Too Large",
		"HTTP/1.1 501 Not Implemented" + goErrorHeaders + "Unsupported transfer encoding",
		"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + goErrorHeaders + "505 HTTP Version Not Supported: unsupported protocol version",
	} {
		out, ok := rewriteGoError([]byte(b))
		if !ok || !strings.Contains(string(out), ProblemContentType) || !strings.Contains(string(out), `"code":"malformed_request"`) {
			t.Errorf("%q → %q", b, out)
		}
	}
}
