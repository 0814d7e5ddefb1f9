// SPDX-License-Identifier: Apache-2.0

package secrets

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// diagnosticsOverrides are the agent's [diagnostics] options of the
// world: a tiny fake nvidia-bug-report.sh, a fake kernel log and the
// agent's log file (startAgent writes it).
func (w *world) diagnosticsOverrides() []string {
	t := w.t
	tool := w.path("nvidia-bug-report.sh")
	testsvc.Must(t, os.WriteFile(tool, []byte("#!/bin/sh\n[ \"$1\" = --output-file ] || exit 2\n"+
		"printf 'nvidia-bug-report.sh fake\\nNVRM version: 550.90.05\\n' | gzip > \"$2.gz\"\n"), 0o755), "fake bug report tool")
	testsvc.Must(t, os.WriteFile(w.path("kmsg"), []byte("[  1.000] usb 1-1: new high-speed USB device\n"+
		"[ 42.000] NVRM: GPU at PCI:0000:3b:00: GPU-fake: Xid (PCI:0000:3b:00): 43, pid=1234\n"), 0o644), "fake kernel log")
	return []string{"diagnostics.bug_report_tool=" + tool, "diagnostics.kernel_log_file=" + w.path("kmsg"),
		"diagnostics.log_file=" + w.path("agent.log"), "diagnostics.bug_report_timeout=30s"}
}

// TestDiagnosticsBundle: vgpuctl diagnose HOST --instance VM asks the
// bridge, which sends a signed collect_diagnostics to the host's agent
// (fake host, real RabbitMQ and Postgres); the agent's signed result
// carries the bundle back; vgpuctl writes it. Every part is there, and no
// secret of the bridge or the agent is in it, in any encoding. A reader
// is refused; the request is audited.
func TestDiagnosticsBundle(t *testing.T) {
	w := newWorld(t)
	vm := w.vms[0]

	// Not for a reader.
	if a := w.do(nil, http.MethodPost, "/v1/hosts/"+w.host+"/diagnostics", []byte(`{}`),
		map[string]string{"X-Auth-Token": w.readerToken}); a.status != http.StatusForbidden {
		t.Fatalf("reader: POST diagnostics = %d %s, want 403", a.status, a.body)
	}
	// Unknown host.
	if a := w.do(nil, http.MethodPost, "/v1/hosts/no-such-host/diagnostics", nil,
		map[string]string{"X-Auth-Token": w.adminToken}); a.status != http.StatusNotFound {
		t.Fatalf("unknown host = %d %s, want 404", a.status, a.body)
	}

	out := w.path("bundle.tar.gz")
	cmd := exec.CommandContext(w.ctx, testsvc.Binary(t, "vgpuctl"), "--url", w.apiURL, "diagnose", w.host,
		"--instance", vm, "--wait-timeout", "2m", "--interval", "200ms", "-o", out)
	cmd.Env = append(os.Environ(), "VGPUCTL_TOKEN="+w.adminToken)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("vgpuctl diagnose: %v\n%s\nagent log:\n%s", err, b, strings.Join(w.agentLog.Lines(), "\n"))
	}
	raw, err := os.ReadFile(out)
	testsvc.Must(t, err, "read bundle")
	files := untar(t, raw)
	for _, name := range []string{"diagnose.json", "nvidia-bug-report.log.gz", "domains/" + vm + ".xml", "nvrm.log", "sysfs.txt",
		"agent.log", "journal.json", "version.txt", "agent.conf", "MANIFEST.json"} {
		if len(files[name]) == 0 {
			t.Errorf("part %s missing or empty; parts: %v\nmanifest: %s", name, names(files), files["MANIFEST.json"])
		}
	}
	var man struct {
		Parts []struct {
			Name, Skipped, Truncated string
		} `json:"parts"`
	}
	testsvc.Must(t, json.Unmarshal(files["MANIFEST.json"], &man), "manifest")
	for _, p := range man.Parts {
		if p.Skipped != "" || p.Truncated != "" {
			t.Errorf("manifest: %s skipped %q truncated %q", p.Name, p.Skipped, p.Truncated)
		}
	}
	if !strings.Contains(string(files["nvrm.log"]), "Xid") || strings.Contains(string(files["nvrm.log"]), "usb") {
		t.Errorf("nvrm.log: %q", files["nvrm.log"])
	}
	if !strings.Contains(string(files["domains/"+vm+".xml"]), vm) {
		t.Errorf("domain XML of %s: %s", vm, files["domains/"+vm+".xml"])
	}
	if c := string(files["agent.conf"]); !strings.Contains(c, "signing_key_file = "+w.path("agent.key")) || !strings.Contains(c, "transport_url_file = ") {
		t.Errorf("agent.conf lacks the key and transport files' paths:\n%s", c)
	}
	if !strings.Contains(string(files["sysfs.txt"]), "mdev_supported_types") {
		t.Errorf("sysfs.txt lacks the mdev types:\n%.1500s", files["sysfs.txt"])
	}

	// No secret, in any of its forms (and base64 URL and unpadded forms
	// of the plain ones), in any part, the compressed ones opened too.
	if gz, err := gzip.NewReader(bytes.NewReader(files["nvidia-bug-report.log.gz"])); err == nil {
		files["nvidia-bug-report.log"], _ = io.ReadAll(gz)
	}
	for _, s := range w.secrets {
		forms := append([]string{}, s.forms...)
		forms = append(forms, base64.URLEncoding.EncodeToString([]byte(s.forms[0])), base64.RawStdEncoding.EncodeToString([]byte(s.forms[0])),
			base64.RawURLEncoding.EncodeToString([]byte(s.forms[0])))
		for name, b := range files {
			for _, f := range forms {
				if f != "" && bytes.Contains(b, []byte(f)) {
					t.Errorf("%s holds the %s (as %.12s…)", name, s.name, f)
				}
			}
		}
	}

	var audited int
	testsvc.Must(t, w.d.Pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE action = 'host.diagnostics' AND object_id = $1 AND actor = 'ops'`,
		w.host).Scan(&audited), "audit")
	if audited != 1 {
		t.Errorf("audit rows of the request: %d, want 1", audited)
	}
	var stored int
	testsvc.Must(t, w.d.Pool.QueryRow(w.ctx, `SELECT length(bundle) FROM diagnostics WHERE host = $1 AND status = 'complete'`,
		w.host).Scan(&stored), "stored bundle")
	if stored != len(raw) {
		t.Errorf("stored bundle %d bytes, downloaded %d", stored, len(raw))
	}
}

func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	testsvc.Must(t, err, "gzip")
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		testsvc.Must(t, err, "tar")
		out[h.Name], _ = io.ReadAll(tr)
	}
}

func names(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, filepath.Clean(k))
	}
	return out
}
