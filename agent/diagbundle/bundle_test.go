// SPDX-License-Identifier: Apache-2.0

package diagbundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
)

func TestScrubConfig(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"declared secret already masked", "[DEFAULT] transport_url = *** (file)", "[DEFAULT] transport_url = *** (file)"},
		{"url password in any option", "[other] url = rabbit://agent:s3cr3t@rabbit1:5672/vh (file)", "[other] url = rabbit://agent:***@rabbit1:5672/vh (file)"},
		{"two urls", "[x] urls = amqp://a:p1@h1,amqp://b:p2@h2 (env)", "[x] urls = amqp://a:***@h1,amqp://b:***@h2 (env)"},
		{"url without password", "[x] url = http://h:8778/placement (file)", "[x] url = http://h:8778/placement (file)"},
		{"name like a secret", "[keystone] password = hunter2 (file)", "[keystone] password = *** (file)"},
		{"token", "[api] admin_token = abc (env)", "[api] admin_token = *** (env)"},
		{"file path is kept", "[security] signing_key_file = /etc/vgpu/agent.key (file)", "[security] signing_key_file = /etc/vgpu/agent.key (file)"},
		{"empty secret", "[keystone] password =  (default)", "[keystone] password =  (default)"},
		{"not a secret", "[DEFAULT] host = compute-1 (file)", "[DEFAULT] host = compute-1 (file)"},
		{"no source", "[a] secret = v", "[a] secret = ***"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ScrubConfig([]string{tc.in})[0]; got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFit(t *testing.T) {
	mk := func(sizes ...int) []Part {
		var ps []Part
		for i, n := range sizes {
			ps = append(ps, Part{Name: string(rune('a' + i)), Data: bytes.Repeat([]byte{byte('a' + i)}, n)})
		}
		return ps
	}
	for _, tc := range []struct {
		name   string
		sizes  []int
		budget int
		want   []int
	}{
		{"fits", []int{10, 20}, 30, []int{10, 20}},
		{"largest cut first", []int{10, 100, 20}, 60, []int{10, 30, 20}},
		{"down to the next then shared", []int{10, 100, 40}, 50, []int{10, 20, 20}},
		{"equal parts share", []int{50, 50}, 60, []int{30, 30}},
		{"zero budget", []int{5, 7}, 0, []int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := mk(tc.sizes...)
			cut := Fit(ps, tc.budget)
			total := 0
			for i, p := range ps {
				total += len(p.Data)
				if len(p.Data) != tc.want[i] {
					t.Errorf("part %d: %d bytes, want %d", i, len(p.Data), tc.want[i])
				}
				if (len(p.Data) < tc.sizes[i]) != (p.Truncated != "") {
					t.Errorf("part %d: truncated %q after %d -> %d", i, p.Truncated, tc.sizes[i], len(p.Data))
				}
			}
			if total > tc.budget && tc.budget >= 0 {
				t.Errorf("total %d over budget %d", total, tc.budget)
			}
			if cut != (total < sum(tc.sizes)) {
				t.Errorf("cut = %v", cut)
			}
		})
	}
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

func TestFitKeepTail(t *testing.T) {
	ps := []Part{{Name: "log", Data: []byte("old-lines\nnew-lines\n"), KeepTail: true}, {Name: "x", Data: []byte("head-tail")}}
	Fit(ps, 14)
	if string(ps[0].Data) != "-lines\n" || string(ps[1].Data) != "head-ta" { // 29 bytes into 14: 20 -> 9, then 7 each
		t.Fatalf("got %q %q", ps[0].Data, ps[1].Data)
	}
	if !strings.Contains(ps[0].Truncated, "at the start") || !strings.Contains(ps[1].Truncated, "at the end") {
		t.Fatalf("reasons %q %q", ps[0].Truncated, ps[1].Truncated)
	}
}

func TestBuildStaysUnderLimit(t *testing.T) {
	for _, max := range []int{64 << 10, 1 << 20} {
		big := make([]byte, 3<<20)
		_, _ = rand.Read(big) // incompressible
		ps := []Part{{Name: "a.bin", Data: big}, {Name: "b.txt", Data: bytes.Repeat([]byte("x"), 100)}, {Name: "gone", Skipped: "not here"}}
		m := Manifest{MaxBytes: max}
		out, err := Build(ps, &m)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) > max {
			t.Fatalf("bundle %d bytes over %d", len(out), max)
		}
		files := untar(t, out)
		var got Manifest
		if err := json.Unmarshal(files[PartManifest], &got); err != nil {
			t.Fatal(err)
		}
		if got.Parts[0].Truncated == "" || got.Parts[0].OriginalSize != 3<<20 || got.Parts[0].Size != len(files["a.bin"]) {
			t.Fatalf("manifest %+v", got.Parts[0])
		}
		if got.Parts[1].Truncated != "" || len(files["b.txt"]) != 100 {
			t.Fatalf("small part touched: %+v", got.Parts[1])
		}
		if _, ok := files["gone"]; ok || got.Parts[2].Skipped != "not here" {
			t.Fatalf("skipped part: %+v", got.Parts[2])
		}
	}
}

func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name], _ = io.ReadAll(tr)
	}
}

type fakeDiag struct{}

func (fakeDiag) Diagnose(context.Context, []string) (json.RawMessage, error) {
	return json.RawMessage(`{"findings":[{"check":"license","severity":"error"}]}`), nil
}

type fakeDomains map[string]string

func (f fakeDomains) DomainXMLs(_ context.Context, instance string) (map[string]string, error) {
	if instance == "" {
		return f, nil
	}
	if x, ok := f[instance]; ok {
		return map[string]string{instance: x}, nil
	}
	return nil, nil
}

// TestCollect gathers a bundle on a fake host with a fake
// nvidia-bug-report.sh and checks every part is there and that no secret
// of the configuration reaches the bundle in any encoding.
func TestCollect(t *testing.T) {
	dir := t.TempDir()
	h, err := fakehost.Build(filepath.Join(dir, "host"), fakehost.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	const password, keyMaterial = "Pa55-w0rd-transport", "PRIVATE-KEY-MATERIAL-0123456789"
	keyFile := filepath.Join(dir, "agent.key")
	write(t, keyFile, keyMaterial)
	tool := filepath.Join(dir, "fake-bug-report.sh")
	write(t, tool, "#!/bin/sh\n[ \"$1\" = --output-file ] || exit 2\necho 'nvidia-bug-report fake' | gzip > \"$2.gz\"\n")
	if err := os.Chmod(tool, 0o755); err != nil {
		t.Fatal(err)
	}
	kmsg := filepath.Join(dir, "kmsg")
	write(t, kmsg, "[1.0] usb 1-1: new device\n[2.0] NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.\n")
	logFile := filepath.Join(dir, "agent.log")
	write(t, logFile, `{"msg":"connected","url":"rabbit://agent:`+password+`@rabbit1/"}`+"\n")
	const inst = "4e1c3a57-4b2f-4d5e-9f3c-2d1a0b9c8e7f"
	c := &Collector{
		Diagnoser: fakeDiag{}, Domains: fakeDomains{inst: "<domain><uuid>" + inst + "</uuid></domain>"},
		BugReportTool: tool, NVRMFile: kmsg, SysfsRoot: h.SysRoot, LogFile: logFile,
		Journal: func() ([]byte, error) { return []byte(`{"commands":[]}`), nil },
		Version: "vgpu-agent 9.9.9",
		Config: []string{
			"[DEFAULT] transport_url = *** (file)",
			"[DEFAULT] transport_url_file = /etc/vgpu/transport_url (file)",
			"[other] broker = rabbit://agent:" + password + "@rabbit1:5672/ (env)",
			"[security] signing_key_file = " + keyFile + " (file)",
			"[keystone] password = " + password + " (file)",
		},
	}
	out, m, err := c.Collect(context.Background(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	files := untar(t, out)
	for _, name := range []string{PartDiagnose, PartBugReport, "domains/" + inst + ".xml", PartNVRM, PartSysfs, PartAgentLog,
		PartJournal, PartVersion, PartConfig, PartManifest} {
		if len(files[name]) == 0 {
			t.Errorf("part %s missing or empty (manifest %+v)", name, m.Parts)
		}
	}
	for _, p := range m.Parts {
		if p.Skipped != "" || p.Truncated != "" {
			t.Errorf("part %+v skipped or truncated", p)
		}
	}
	if s := string(files[PartNVRM]); !strings.Contains(s, "fallen off the bus") || strings.Contains(s, "usb") {
		t.Errorf("nvrm.log: %q", s)
	}
	if s := string(files[PartSysfs]); !strings.Contains(s, "mdev_supported_types/nvidia-232/name: GRID T4-4Q") {
		t.Errorf("sysfs.txt lacks the T4's types:\n%.2000s", s)
	}
	if !strings.Contains(string(files[PartConfig]), keyFile) {
		t.Errorf("agent.conf lacks the key file's path")
	}
	AssertNoSecret(t, files, password, keyMaterial)

	// Only the instance asked for.
	_, m, err = c.Collect(context.Background(), "00000000-0000-0000-0000-000000000000", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.Parts[2].Skipped, "not found") {
		t.Errorf("unknown instance: %+v", m.Parts[2])
	}
}

func TestCollectMissingTool(t *testing.T) {
	c := &Collector{BugReportTool: "no-such-nvidia-bug-report.sh", Version: "v"}
	_, m, err := c.Collect(context.Background(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Parts {
		if p.Name == PartBugReport && !strings.Contains(p.Skipped, "not found") {
			t.Fatalf("bug report part %+v", p)
		}
	}
}

// AssertNoSecret fails when any file holds a secret in plain, hex or
// base64 (standard or URL, padded or not) form.
func AssertNoSecret(t *testing.T, files map[string][]byte, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		forms := []string{s, hex.EncodeToString([]byte(s)), base64.StdEncoding.EncodeToString([]byte(s)),
			base64.URLEncoding.EncodeToString([]byte(s)), base64.RawStdEncoding.EncodeToString([]byte(s)),
			base64.RawURLEncoding.EncodeToString([]byte(s))}
		for name, b := range files {
			for _, f := range forms {
				if bytes.Contains(b, []byte(f)) {
					t.Errorf("%s holds secret %q as %q", name, s, f)
				}
			}
		}
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
