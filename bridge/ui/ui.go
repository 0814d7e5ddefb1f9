// Package ui serves the operator dashboard at /ui: one read-only page
// (HTML, CSS and vanilla JavaScript embedded in the binary, nothing from
// a CDN) that reads the operator API under /v1 with the caller's own
// token, and GET /v1/status, the ingest lag and agent report summary the
// page shows beside the fleet.
//
// The page itself holds no data and is public, like /v1/openapi.json;
// every figure on it comes from /v1 calls made by the browser with the
// token the operator typed (kept in sessionStorage, sent as
// X-Auth-Token), so it sees exactly what that token may see.
package ui

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

//go:embed static
var static embed.FS

//go:embed openapi.json
var openAPI []byte

// Config configures the dashboard and its status endpoint.
type Config struct {
	// Pool is the bridge's database (events, hosts, dead letters).
	Pool *pgxpool.Pool
	// StaleReportAge is [placement] stale_report_age: hosts whose last
	// agent report is older are marked stale.
	StaleReportAge time.Duration
	// Version is shown in the page footer.
	Version string
}

// Handler serves /ui and GET /v1/status.
type Handler struct {
	cfg    Config
	assets map[string]asset

	mu       sync.Mutex // held while the status is read: one query at a time
	cached   Status
	cachedAt time.Time
}

type asset struct {
	body  []byte
	ctype string
	etag  string
}

// New returns the dashboard handler.
func New(cfg Config) *Handler {
	h := &Handler{cfg: cfg, assets: map[string]asset{}}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		h.assets[strings.TrimPrefix(p, "static/")] = asset{body: b, ctype: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("ui: embedded assets: " + err.Error()) // the build embeds them; cannot happen
	}
	return h
}

// Register adds GET /ui (the page), GET /ui/* (its assets),
// GET /v1/status and GET /v1/hosts/{name}/report to srv and describes them.
func (h *Handler) Register(srv *api.Server) {
	srv.Handle(http.MethodGet, "/ui", api.Public, h.page)
	srv.Handle(http.MethodGet, "/ui/*", api.Public, h.file)
	srv.Handle(http.MethodGet, "/v1/status", api.Fleet, h.status)
	srv.Handle(http.MethodGet, "/v1/hosts/:name/report", api.Fleet, h.hostReport)
	srv.Describe(openAPI)
}

// contentSecurityPolicy allows the page only its own scripts, styles and
// API: no inline script, no third party, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (h *Handler) page(c echo.Context) error { return h.serve(c, "index.html") }

func (h *Handler) file(c echo.Context) error {
	name := c.Param("*")
	if name == "" {
		return h.serve(c, "index.html")
	}
	return h.serve(c, name)
}

func (h *Handler) serve(c echo.Context, name string) error {
	a, ok := h.assets[name]
	if !ok {
		return api.Problem(http.StatusNotFound, "Not Found", "the dashboard has no file "+name)
	}
	hd := c.Response().Header()
	hd.Set("Content-Security-Policy", contentSecurityPolicy)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	// Revalidate every time: a new binary may ship new assets under the
	// same names; the ETag makes the check cheap.
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", a.etag)
	if match := c.Request().Header.Get("If-None-Match"); match != "" && etagMatches(match, a.etag) {
		return c.NoContent(http.StatusNotModified)
	}
	return c.Blob(http.StatusOK, a.ctype, a.body)
}

func etagMatches(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(t), "W/"))
		if t == etag || t == "*" {
			return true
		}
	}
	return false
}
