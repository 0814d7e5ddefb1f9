package requestid

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestTransport(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get(Header))
	}))
	defer srv.Close()
	hc := &http.Client{Transport: Transport(nil)}
	id := "req-5b0e8a4e-6c1b-4d6e-9a57-0c3f2b7d9e11"
	tests := []struct {
		name   string
		ctx    context.Context
		header string
		want   string
	}{
		{"carried", With(context.Background(), id), "", id},
		{"none", context.Background(), "", ""},
		{"invalid is not carried", With(context.Background(), "req-nope"), "", ""},
		{"caller's own header wins", With(context.Background(), id), "req-00000000-0000-0000-0000-000000000001", "req-00000000-0000-0000-0000-000000000001"},
	}
	for _, tt := range tests {
		got = nil
		req, _ := http.NewRequestWithContext(tt.ctx, http.MethodGet, srv.URL, nil)
		if tt.header != "" {
			req.Header.Set(Header, tt.header)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(got) != 1 || got[0] != tt.want {
			t.Errorf("%s: header %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestHandler(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(Handler(slog.NewTextHandler(&b, nil))).With("component", "x")
	id := "req-5b0e8a4e-6c1b-4d6e-9a57-0c3f2b7d9e11"
	log.InfoContext(With(context.Background(), id), "hello")
	log.Info("plain")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], LogKey+"="+id) || strings.Contains(lines[1], LogKey) {
		t.Fatalf("log:\n%s", b.String())
	}
}
