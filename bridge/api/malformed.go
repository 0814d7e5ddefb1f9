package api

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// Go's net/http answers a request it cannot parse (a header value with a
// control character, a header name with a space, a bad Content-Length or
// Host, a header over its own limit, an unknown transfer coding, an
// unsupported protocol version) itself, before any handler runs, with a
// text/plain body written straight to the connection. On a plain (not
// TLS) listener, problemConn rewrites those answers into problem+json with
// code "malformed_request" and the same status, keeping Connection: close.
// On a TLS listener the connection net/http writes to must be its
// *tls.Conn, so Go's text answer stays: those requests never reach the
// bridge's code either way.

// goErrorHeaders is what follows the status line of net/http's own
// refusals (server.go), and of nothing a handler writes: net/http puts
// Date first in every handler's answer.
const goErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

type problemListener struct{ net.Listener }

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return problemConn{c}, nil
}

type problemConn struct{ net.Conn }

func (c problemConn) Write(b []byte) (int, error) {
	if p, ok := rewriteGoError(b); ok {
		if _, err := c.Conn.Write(p); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// CloseWrite half-closes as net/http does after its refusal of a header
// over its limit.
func (c problemConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// rewriteGoError turns one of net/http's own plain-text refusals, written
// in one piece, into a problem+json answer; false for anything else.
func rewriteGoError(b []byte) ([]byte, bool) {
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 ")) {
		return nil, false
	}
	line, rest, ok := bytes.Cut(b, []byte(goErrorHeaders))
	if !ok || bytes.Contains(line, []byte("\r\n")) {
		return nil, false
	}
	code, err := strconv.Atoi(string(line[len("HTTP/1.1 "):min(len(line), len("HTTP/1.1 ")+3)]))
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	detail := strings.TrimSpace(string(rest))
	if _, why, ok := strings.Cut(detail, ": "); ok {
		detail = why
	} else if detail == http.StatusText(code) || strings.HasPrefix(detail, strconv.Itoa(code)) {
		detail = ""
	}
	switch {
	case code == http.StatusRequestHeaderFieldsTooLarge:
		detail = "the request's header is larger than the server reads"
	case detail == "":
		detail = "the request could not be parsed (a header name or value, Content-Length, Host or the request line is malformed)"
	default:
		detail = "the request could not be parsed: " + detail
	}
	body, _ := json.Marshal(&ProblemDetails{Title: http.StatusText(code), Status: code, Code: "malformed_request", Detail: detail})
	var out bytes.Buffer
	out.WriteString("HTTP/1.1 " + strconv.Itoa(code) + " " + http.StatusText(code) + "\r\n")
	out.WriteString("Content-Type: " + ProblemContentType + "\r\n")
	out.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	out.WriteString("Connection: close\r\n\r\n")
	out.Write(body)
	return out.Bytes(), true
}
