// Package ui tests the dashboard (/ui) in Debian's headless Chromium,
// driven over the DevTools protocol (chromedp), against a real running
// bridge: its fleet in the real Placement, an in-process vgpu-agent on a
// fake host reporting through the real RabbitMQ, Nova notifications, and
// webhook requests carried out end to end. The page must show the fleet
// (hosts, GPUs, used and free vGPUs, agent state), the requests and the
// ingest figures, with no JavaScript error, behind token auth and under
// noauth. A full-page screenshot is kept as a test artifact: under the
// -artifacts output directory (go test -artifacts -outputdir DIR) and, when
// VGPU_TEST_ARTIFACTS is set, in $VGPU_TEST_ARTIFACTS/ui/.
package ui

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// chromiumPath is Debian's chromium, or $VGPU_CHROMIUM; the test fails,
// naming the command that installs it, when it is missing.
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("VGPU_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := exec.LookPath(p); err != nil {
		t.Fatalf("headless Chromium not found at %s (%v): run `make services` (it installs Debian's chromium package), or set VGPU_CHROMIUM", p, err)
	}
	return p
}

// browser is one headless Chromium with an empty profile, and the console
// messages (console API calls, uncaught exceptions, browser log entries)
// of its tab.
type browser struct {
	ctx     context.Context
	mu      sync.Mutex
	console []chromedp.ConsoleMessage
}

func newBrowser(t *testing.T, path string) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.WindowSize(1440, 1000),
	}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	parent, cancelParent := context.WithTimeout(context.Background(), testsvc.Within(3*time.Minute))
	actx, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc(); cancelParent() })
	b := &browser{ctx: ctx}
	messages := chromedp.Console(ctx) // starts the browser and subscribes
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancelCtx(); <-done })
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return b
}

func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		t.Fatalf("%s: %v\nconsole:\n%s", what, err, b.consoleText())
	}
}

func run[T any](t *testing.T, b *browser, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(b.ctx, a)
	if err != nil {
		t.Fatalf("%s: %v\nconsole:\n%s", what, err, b.consoleText())
	}
	return v
}

// waitText polls the text of sel until ok accepts it, failing the test
// after within.
func (b *browser) waitText(t *testing.T, sel string, within time.Duration, ok func(string) bool) string {
	t.Helper()
	within = testsvc.Within(within)
	deadline := time.Now().Add(within)
	for {
		s := run(t, b, sel, chromedp.Text(chromedp.CSS(sel)))
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still shows %q after %s", sel, s, within)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (b *browser) consoleText() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s []string
	for _, m := range b.console {
		s = append(s, "  "+m.String())
	}
	return strings.Join(s, "\n")
}

// errors lists the console's errors and exceptions, less the browser's
// network log lines of answers the page handles and explains (401 before
// signing in, 403 for a role that may not read a part, 404 where GET
// /v1/drift is not served): those are not script errors. Any other failed
// load (a 5xx, a missing asset) counts.
func (b *browser) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.console {
		if m.Type != chromedp.ConsoleError && !m.IsException() {
			continue
		}
		if m.Source == "network" && strings.Contains(m.URL, "/v1/") && (strings.Contains(m.Text, "status of 401") ||
			strings.Contains(m.Text, "status of 403") || (strings.Contains(m.Text, "status of 404") && strings.Contains(m.URL, "/v1/drift"))) {
			continue
		}
		out = append(out, m.String()+" ("+m.URL+")")
	}
	return out
}

// hostCard is what a fleet card shows.
type hostCard struct {
	Name   string     `json:"name"`
	Node   string     `json:"node"`
	Sum    string     `json:"sum"`
	Badges []string   `json:"badges"`
	GPUs   [][]string `json:"gpus"` // GPU, vGPU type, used ("1 / 4"), free, health
}

const cardsJS = `[...document.querySelectorAll('article.host')].map((a) => ({
	name: a.dataset.host, node: a.dataset.node,
	sum: a.querySelector('.host-sum strong').textContent,
	badges: [...a.querySelectorAll('.host-head .badge')].map((b) => b.textContent),
	gpus: [...a.querySelectorAll('tbody tr')].map((r) => [...r.children].map((c) => c.textContent.trim())),
}))`

// TestDashboardMixedGPU: a mixed bridge-owned GPU (HOST/PF=mixed) is a
// row of its host's card, reading "mixed", its framebuffer used and free
// in MiB and its health; the host's vGPU sum and the capacity-by-type
// table leave it out (MiB are no vGPUs).
func TestDashboardMixedGPU(t *testing.T) {
	chromium := chromiumPath(t)
	f := startFleet(t, withMixedGPU())
	a := f.hosts[0]
	var mixed apiclient.GPU
	f.waitFor(30*time.Second, "GET /v1/gpus lists the mixed GPU of "+a.name, func() bool {
		var gl apiclient.GPUList
		if f.getJSON("/v1/gpus?host="+a.node, &gl) != nil {
			return false
		}
		for _, g := range gl.GPUs {
			if g.Mode == apiclient.GPUModeMixed && g.PCIAddress == mixedPF && g.ProviderUUID != "" {
				mixed = g
				return true
			}
		}
		return false
	})
	b := newBrowser(t, chromium)
	b.do(t, "open and sign in", chromedp.Navigate(f.url+"/ui"), chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS("#token"), testbridge.ReaderToken), chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS(`body[data-state="ready"]`)),
		chromedp.WaitVisible(chromedp.CSS(`article.host[data-node="`+a.node+`"] tr[data-mode="mixed"]`)))
	var ca hostCard
	for _, c := range run(t, b, "read the fleet", chromedp.Evaluate[[]hostCard](cardsJS)) {
		if c.Node == a.node {
			ca = c
		}
	}
	if ca.Sum != "1 / 8 used" || len(ca.GPUs) != 3 {
		t.Fatalf("card of %s = %+v; want 1 / 8 used (the T4s' vGPUs) and 3 GPUs", a.node, ca)
	}
	i := slices.IndexFunc(ca.GPUs, func(r []string) bool { return len(r) > 0 && r[0] == mixedPF })
	if i < 0 {
		t.Fatalf("card of %s has no row of %s: %q", a.node, mixedPF, ca.GPUs)
	}
	r := ca.GPUs[i]
	wantUsed := fmt.Sprintf("%d / %d MiB", mixed.Used, mixed.Capacity)
	if len(r) != 5 || !strings.HasPrefix(r[1], "mixed") || r[2] != wantUsed || r[3] != fmt.Sprintf("%d MiB", mixed.Free) || !strings.HasPrefix(r[4], "ok") ||
		mixed.Capacity <= 0 {
		t.Errorf("mixed GPU row = %q; want mixed, %s, %d MiB free, health ok", r, wantUsed, mixed.Free)
	}
	// The card's summary counts the mixed GPU and its framebuffer free
	// (GET /v1/hosts: gpu_count, framebuffer).
	wantSum := fmt.Sprintf("3 GPUs · %d MiB of mixed framebuffer free", mixed.Free)
	if sum := run(t, b, "host summary", chromedp.Text(chromedp.CSS(`article.host[data-node="`+a.node+`"] .host-sum`))); !strings.Contains(sum, wantSum) {
		t.Errorf("summary of %s = %q, want it to say %q", a.node, sum, wantSum)
	}
	if types := run(t, b, "types", chromedp.Text(chromedp.CSS("#types"))); strings.Contains(types, "CUSTOM_VGPU_BRIDGE_FB_MIB") || strings.Contains(types, "mixed") {
		t.Errorf("capacity by type lists the mixed GPU: %q", types)
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

func TestDashboard(t *testing.T) {
	chromium := chromiumPath(t)
	f := startFleet(t)
	a, bh := f.hosts[0], f.hosts[1]
	b := newBrowser(t, chromium)
	ui := f.url + "/ui"

	// Token auth: without a token the page asks for one, and says why.
	b.do(t, "open "+ui, chromedp.Navigate(ui), chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.WaitReady(chromedp.CSS(`body[data-state="auth"]`)))
	if alert := run(t, b, "alert", chromedp.Text(chromedp.CSS("#alert"))); !strings.Contains(alert, "Sign in to read the operator API (401 Unauthorized).") {
		t.Errorf("alert without a token = %q", alert)
	}
	b.do(t, "sign in", chromedp.SendKeys(chromedp.CSS("#token"), testbridge.ReaderToken), chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS(`body[data-state="ready"]`)),
		chromedp.WaitVisible(chromedp.CSS(`article.host[data-node="`+a.node+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-request="`+f.requests["attach"]+`"]`)))
	if tok := run(t, b, "sessionStorage", chromedp.Evaluate[string](`sessionStorage.getItem('vgpu-bridge.dashboard.token')`)); tok != testbridge.ReaderToken {
		t.Errorf("sessionStorage token = %q, want the reader token", tok)
	}

	// The fleet: both hosts, their GPUs, used and free vGPUs, agent state.
	cards := map[string]hostCard{}
	for _, c := range run(t, b, "read the fleet", chromedp.Evaluate[[]hostCard](cardsJS)) {
		cards[c.Node] = c
	}
	ca, cb := cards[a.node], cards[bh.node]
	if ca.Name != a.name || ca.Sum != "1 / 8 used" || len(ca.GPUs) != 2 {
		t.Errorf("card of %s = %+v; want its compute host name, 1 / 8 used and 2 GPUs", a.node, ca)
	}
	if cb.Sum != "3 / 6 used" || len(cb.GPUs) != 2 {
		t.Errorf("card of %s = %+v; want 3 / 6 used and 2 GPUs", bh.node, cb)
	}
	for _, tc := range []struct {
		card       hostCard
		row        int
		pci, typ   string
		used, free string
		health     bool // the agent's report gives the GPU's health
	}{
		{ca, 0, "0000:3b:00.0", "T4-4Q", "", "", true},
		{ca, 1, "0000:3c:00.0", "T4-4Q", "", "", true},
		{cb, 0, "0000:3b:00.0", "T4-4Q", "3 / 4", "1", false},
		{cb, 1, "0000:3c:00.0", "T4-8Q", "0 / 2", "2", false},
	} {
		if tc.row >= len(tc.card.GPUs) {
			continue
		}
		r := tc.card.GPUs[tc.row]
		if len(r) != 5 || r[0] != tc.pci || !strings.HasPrefix(r[1], tc.typ) || (tc.used != "" && (r[2] != tc.used || r[3] != tc.free)) ||
			(r[4] != "–") != tc.health {
			t.Errorf("%s GPU row %d = %q; want %s %s used %q free %q, health shown %v", tc.card.Node, tc.row, r, tc.pci, tc.typ, tc.used, tc.free, tc.health)
		}
	}
	// One claim on host A; which GPU holds it is the engine's choice.
	if len(ca.GPUs) == 2 {
		used := ca.GPUs[0][2] + " + " + ca.GPUs[1][2]
		if used != "1 / 4 + 0 / 4" && used != "0 / 4 + 1 / 4" {
			t.Errorf("host A GPU usage = %s; want one vGPU used on one of its two GPUs", used)
		}
	}
	if !hasPrefix(ca.Badges, "Agent · ") || !hasPrefix(cb.Badges, "No agent report") {
		t.Errorf("agent badges: %s %q, %s %q", a.node, ca.Badges, bh.node, cb.Badges)
	}

	// Requests, with their state.
	for label, want := range map[string]string{"attach": "GPU_REQUEST", "release": "GPU_RELEASE"} {
		row := run(t, b, "request row", chromedp.Text(chromedp.CSS(`tr[data-request="`+f.requests[label]+`"]`)))
		if !strings.Contains(row, f.requests[label]) || !strings.Contains(row, want) {
			t.Errorf("request %s row = %q", label, row)
		}
	}
	if st := run(t, b, "attach state", chromedp.Text(chromedp.CSS(`tr[data-request="`+f.requests["attach"]+`"] .badge`))); st != "succeeded" {
		t.Errorf("attach request shows %q, want succeeded", st)
	}

	// Ingest: the Nova notifications were received. GET /v1/status may
	// answer from its 2 s cache, so the next refreshes show them.
	ingest := b.waitText(t, "#ingest", 20*time.Second, func(s string) bool {
		return strings.Contains(s, "Last Nova notification") && !strings.Contains(s, "none received yet") && strings.Contains(s, " ago")
	})
	if !strings.Contains(ingest, "Pending in the inbox\n0\n") {
		t.Errorf("ingest panel = %q; want nothing pending", ingest)
	}
	if drift := run(t, b, "drift", chromedp.Text(chromedp.CSS("#drift"))); strings.HasPrefix(drift, "/v1/drift:") || drift == "Loading…" {
		t.Errorf("drift panel = %q", drift)
	}

	// The screenshot, with the fleet filtered to this test's hosts (the
	// shared Placement holds other tests' providers too).
	b.do(t, "filter", chromedp.SendKeys(chromedp.CSS("#filter"), strings.TrimPrefix(a.name, "ui-compute-a-")),
		chromedp.WaitNotPresent(chromedp.CSS(`article.host:not([data-node$="`+strings.TrimPrefix(a.name, "ui-compute-a-")+`.ui.test"])`)),
		chromedp.Blur(chromedp.CSS("#filter")))
	keep(t, "dashboard.png", run(t, b, "screenshot", chromedp.FullScreenshot(100)))

	// Signing out forgets the token and asks for one again.
	b.do(t, "sign out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.WaitReady(chromedp.CSS(`body[data-state="auth"]`)))
	if tok := run(t, b, "sessionStorage", chromedp.Evaluate[*string](`sessionStorage.getItem('vgpu-bridge.dashboard.token')`)); tok != nil {
		t.Errorf("token still stored after sign-out: %q", *tok)
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}

	// GET /v1/status, which the ingest panel and the agent badges read.
	t.Run("status", func(t *testing.T) {
		var st struct {
			Time   time.Time `json:"time"`
			Ingest struct {
				LastNotificationAt *time.Time `json:"last_notification_at"`
				Delay              *float64   `json:"notification_delay_seconds"`
				Pending            int        `json:"pending_events"`
				OldestPendingAt    *time.Time `json:"oldest_pending_at"`
				ProcessingLag      *float64   `json:"processing_lag_seconds"`
			} `json:"ingest"`
			StaleAge float64 `json:"stale_report_age_seconds"`
			Hosts    []struct {
				Name   string   `json:"name"`
				Node   string   `json:"node"`
				Stale  bool     `json:"stale"`
				Errors []string `json:"errors"`
				GPUs   []struct {
					PCI    string `json:"pci"`
					Health string `json:"health"`
				} `json:"gpus"`
			} `json:"hosts"`
		}
		testsvc.Must(t, f.getJSON("/v1/status", &st), "GET /v1/status")
		in := st.Ingest
		if in.LastNotificationAt == nil || in.LastNotificationAt.After(st.Time) || in.Delay == nil || in.ProcessingLag == nil ||
			in.Pending != 0 || in.OldestPendingAt != nil {
			t.Errorf("ingest = %+v; want the last notification, its delay, a processing lag and nothing pending", in)
		}
		if st.StaleAge != (5 * time.Minute).Seconds() {
			t.Errorf("stale_report_age_seconds = %v, want the default 300", st.StaleAge)
		}
		var seen []string
		for _, h := range st.Hosts {
			seen = append(seen, h.Name)
			switch h.Name {
			case a.name:
				var pcis []string
				for _, g := range h.GPUs {
					pcis = append(pcis, g.PCI+"="+g.Health)
				}
				// The fake host's two T4s and its vendor-VFIO H200.
				if h.Node != a.node || h.Stale || strings.Join(pcis, " ") != "0000:3b:00.0=ok 0000:3c:00.0=ok 0000:c1:00.0=ok" {
					t.Errorf("status of %s = %+v", a.name, h)
				}
			case bh.name:
				t.Errorf("%s has no agent, yet status lists it: %+v", bh.name, h)
			}
		}
		if !slices.Contains(seen, a.name) {
			t.Errorf("status hosts %q lack %s", seen, a.name)
		}
	})

	// noauth: a second replica on the same database lets everyone in; the
	// page needs no token there.
	t.Run("noauth", func(t *testing.T) {
		d := testbridge.Start(t, f.config(t.TempDir(), "api.auth_strategy=noauth"))
		nb := newBrowser(t, chromium)
		nb.do(t, "open", chromedp.Navigate("http://"+d.API.Addr()+"/ui"),
			chromedp.WaitReady(chromedp.CSS(`body[data-state="ready"]`)),
			chromedp.WaitVisible(chromedp.CSS(`article.host[data-node="`+a.node+`"]`)),
			chromedp.WaitNotVisible(chromedp.CSS("#login")))
		if s := run(t, nb, "session", chromedp.Text(chromedp.CSS("#session-text"))); s != "Open API · no token needed" {
			t.Errorf("session text under noauth = %q", s)
		}
		if errs := nb.errors(); len(errs) > 0 {
			t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
		}
	})
}

func hasPrefix(list []string, p string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// keep stores a test artifact under t.ArtifactDir() (kept with
// go test -artifacts) and, when VGPU_TEST_ARTIFACTS is set, under it.
func keep(t *testing.T, name string, data []byte) {
	t.Helper()
	dirs := []string{t.ArtifactDir()}
	if d := os.Getenv("VGPU_TEST_ARTIFACTS"); d != "" {
		dirs = append(dirs, filepath.Join(d, "ui"))
	}
	for _, d := range dirs {
		testsvc.Must(t, os.MkdirAll(d, 0o755), "artifact dir")
		p := filepath.Join(d, name)
		testsvc.Must(t, os.WriteFile(p, data, 0o644), "write artifact")
		t.Logf("artifact: %s", p)
	}
}
