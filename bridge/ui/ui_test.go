package ui

import (
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

func newServer(t *testing.T) *api.Server {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("reader-tok reader viewer\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := api.LoadTokenFile(tokens)
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Auth: auth})
	New(Config{Version: "1.2.3"}).Register(srv)
	return srv
}

func get(srv *api.Server, path string, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, req)
	return rec
}

func TestServe(t *testing.T) {
	srv := newServer(t)
	for _, tc := range []struct {
		path, wantType, wantBody string
		wantCode                 int
	}{
		{"/ui", "text/html; charset=utf-8", `<script src="/ui/app.js" defer></script>`, 200},
		{"/ui/", "text/html; charset=utf-8", `<title>vgpu-bridge · dashboard</title>`, 200},
		{"/ui/app.js", "text/javascript; charset=utf-8", "'use strict';", 200},
		{"/ui/app.css", "text/css; charset=utf-8", ":root {", 200},
		{"/ui/favicon.svg", "image/svg+xml", "<svg", 200},
		{"/ui/nope.js", api.ProblemContentType, `"the dashboard has no file nope.js"`, 404},
		{"/ui/../bridge.go", api.ProblemContentType, `"status":404`, 404},
	} {
		t.Run(tc.path, func(t *testing.T) {
			rec := get(srv, tc.path, nil)
			if rec.Code != tc.wantCode || rec.Header().Get("Content-Type") != tc.wantType || !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Fatalf("GET %s = %d %q, want %d %q containing %q\n%.300s", tc.path, rec.Code, rec.Header().Get("Content-Type"),
					tc.wantCode, tc.wantType, tc.wantBody, rec.Body.String())
			}
			if tc.wantCode == 200 {
				for k, want := range map[string]string{
					"Content-Security-Policy": contentSecurityPolicy,
					"X-Content-Type-Options":  "nosniff",
					"Cache-Control":           "no-cache",
					"X-Frame-Options":         "DENY",
				} {
					if got := rec.Header().Get(k); got != want {
						t.Errorf("%s = %q, want %q", k, got, want)
					}
				}
			}
		})
	}
}

func TestETag(t *testing.T) {
	srv := newServer(t)
	first := get(srv, "/ui/app.js", nil)
	etag := first.Header().Get("ETag")
	if etag == "" {
		t.Fatal("no ETag")
	}
	for _, tc := range []struct {
		match string
		want  int
	}{
		{etag, http.StatusNotModified},
		{"W/" + etag, http.StatusNotModified},
		{`"other", ` + etag, http.StatusNotModified},
		{`"other"`, http.StatusOK},
	} {
		if rec := get(srv, "/ui/app.js", map[string]string{"If-None-Match": tc.match}); rec.Code != tc.want {
			t.Errorf("If-None-Match %s = %d, want %d", tc.match, rec.Code, tc.want)
		}
	}
}

// The page is public; its data is not.
func TestStatusNeedsAReader(t *testing.T) {
	srv := newServer(t)
	if rec := get(srv, "/v1/status", nil); rec.Code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/status without token = %d, want 401", rec.Code)
	}
	rec := get(srv, "/v1/status", map[string]string{"X-Auth-Token": "reader-tok"})
	var st Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); rec.Code != 200 || err != nil || st.Version != "1.2.3" || st.Hosts == nil {
		t.Fatalf("GET /v1/status = %d %v %s", rec.Code, err, rec.Body)
	}
}

func TestRoutesDescribed(t *testing.T) {
	srv := newServer(t)
	if u := srv.Undescribed(); len(u) > 0 {
		t.Fatalf("undescribed routes: %v", u)
	}
}

// Everything the page loads is embedded: no CDN, no other origin, and
// every /ui/ link in the page names an embedded file.
func TestAssetsSelfContained(t *testing.T) {
	h := New(Config{})
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := static.ReadFile(p)
		text := strings.ReplaceAll(string(b), `xmlns="http://www.w3.org/2000/svg"`, "")
		if m := external.FindString(text); m != "" {
			t.Errorf("%s refers to another origin: %s", p, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	page := string(h.assets["index.html"].body)
	links := regexp.MustCompile(`(?:src|href)="/ui/([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(links) < 3 {
		t.Fatalf("index.html links %d assets, want the script, the style sheet and the icon", len(links))
	}
	for _, l := range links {
		if _, ok := h.assets[l[1]]; !ok {
			t.Errorf("index.html links /ui/%s, which is not embedded", l[1])
		}
	}
}

func TestStatusAged(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	st := Status{Time: t0, Ingest: Ingest{NotificationAgeSeconds: f(4), EventAgeSeconds: f(1), PendingEvents: 2,
		ProcessingLagSeconds: f(0.5), NotificationDelaySeconds: f(0.1)},
		Hosts: []HostStatus{{Name: "cn1", ReportAgeSeconds: f(10)}, {Name: "cn2"}}}
	got := st.aged(1500 * time.Millisecond)
	if !got.Time.Equal(t0.Add(1500*time.Millisecond)) || *got.Ingest.NotificationAgeSeconds != 5.5 || *got.Ingest.EventAgeSeconds != 2.5 ||
		got.Ingest.OldestPendingAgeSeconds != nil || *got.Hosts[0].ReportAgeSeconds != 11.5 || got.Hosts[1].ReportAgeSeconds != nil {
		t.Errorf("aged = %+v", got)
	}
	// Durations are not ages; the original is unchanged.
	if *got.Ingest.ProcessingLagSeconds != 0.5 || *got.Ingest.NotificationDelaySeconds != 0.1 || got.Ingest.PendingEvents != 2 {
		t.Errorf("aged changed durations or counts: %+v", got.Ingest)
	}
	if *st.Ingest.NotificationAgeSeconds != 4 || *st.Hosts[0].ReportAgeSeconds != 10 || !st.Time.Equal(t0) {
		t.Errorf("aged changed its receiver: %+v", st)
	}
}

func TestStatusCached(t *testing.T) {
	h := New(Config{Version: "v"})
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	first, err := h.cachedStatus(context.Background(), clock)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		after  time.Duration
		cached bool
	}{{time.Second, true}, {statusTTL - time.Millisecond, true}, {statusTTL, false}} {
		now = h.cachedAt.Add(tc.after)
		st, _ := h.cachedStatus(context.Background(), clock)
		if cached := st.Time.Equal(first.Time.Add(tc.after)); cached != tc.cached {
			t.Errorf("%s after the query: cached = %v, want %v", tc.after, cached, tc.cached)
		}
		first = h.cached
	}
}
