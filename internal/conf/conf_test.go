package conf

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func testSet() (*Set, String, Int, Duration, List, String, Bool) {
	g := NewGroup()
	url := g.Secret("database", "connection", "Database URL. Example: postgres://x")
	n := g.Int("database", "max_connections", 16, 1, 100, "Pool size. Example: 8")
	d := g.Duration("api", "read_timeout", 30*time.Second, time.Second, time.Hour, "Read timeout. Example: 10s")
	l := g.List("devices", "enabled_types", "", "Types. Example: nvidia-232,nvidia-233")
	c := g.Choice("api", "auth_strategy", "token", []string{"noauth", "token"}, "Auth. Example: noauth")
	b := g.Bool(DefaultSection, "debug", false, "Debug. Example: true")
	g.Template("webhook_source", "One webhook source.",
		Option{Name: "auth", Kind: KindChoice, Choices: []string{"hmac", "bearer", "mtls"}, Required: true, Help: "Auth scheme. Example: hmac"},
		Option{Name: "rate", Kind: KindFloat, Default: "10", Help: "Requests per second. Example: 50"},
		Option{Name: "secret_files", Kind: KindList, Help: "Secrets. Example: /etc/a,/etc/b"},
	)
	return NewSet("VGPU_TEST", g), url, n, d, l, c, b
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.conf")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "[database]\nmax_connections = 4\nconnection = postgres://file\n[api]\nread_timeout = 45\n")
	tests := []struct {
		name      string
		env       []string
		overrides []string
		wantN     int
		wantURL   string
		wantRT    time.Duration
		wantSrc   string
	}{
		{name: "file over defaults", wantN: 4, wantURL: "postgres://file", wantRT: 45 * time.Second, wantSrc: "file " + file},
		{name: "env over file", env: []string{"VGPU_TEST_DATABASE_MAX_CONNECTIONS=7", "OTHER=1"}, wantN: 7, wantURL: "postgres://file", wantRT: 45 * time.Second, wantSrc: "environment VGPU_TEST_DATABASE_MAX_CONNECTIONS"},
		{name: "flag over env", env: []string{"VGPU_TEST_DATABASE_MAX_CONNECTIONS=7"}, overrides: []string{"database.max_connections=9", "api.read_timeout=2m"}, wantN: 9, wantURL: "postgres://file", wantRT: 2 * time.Minute, wantSrc: "flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url, n, d, _, _, _ := testSet()
			v, err := s.Load(Source{File: file, Environ: tt.env, Overrides: tt.overrides})
			if err != nil {
				t.Fatal(err)
			}
			if got := n.Get(v); got != tt.wantN {
				t.Errorf("max_connections = %d, want %d", got, tt.wantN)
			}
			if got := url.Get(v); got != tt.wantURL {
				t.Errorf("connection = %q, want %q", got, tt.wantURL)
			}
			if got := d.Get(v); got != tt.wantRT {
				t.Errorf("read_timeout = %v, want %v", got, tt.wantRT)
			}
			if got := v.Source("database", "max_connections"); got != tt.wantSrc {
				t.Errorf("source = %q, want %q", got, tt.wantSrc)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	s, _, n, d, l, c, b := testSet()
	v, err := s.Load(Source{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Get(v) != 16 || d.Get(v) != 30*time.Second || len(l.Get(v)) != 0 || c.Get(v) != "token" || b.Get(v) {
		t.Errorf("defaults: %d %v %v %q %v", n.Get(v), d.Get(v), l.Get(v), c.Get(v), b.Get(v))
	}
}

func TestEveryProblemReported(t *testing.T) {
	file := writeFile(t, `[database]
max_connections = many
connection = postgres://u:hunter2@db/x
[api]
read_timeout = 2h
auth_strategy = keystone
[webhook_source:batch]
rate = fast
colour = blue
[webhook_source:]
auth = hmac
`)
	s, _, _, _, _, _, _ := testSet()
	_, err := s.Load(Source{File: file, Overrides: []string{"nosuch.option=1", "garbage"}})
	es, ok := AsErrors(err)
	if !ok {
		t.Fatalf("want Errors, got %v", err)
	}
	got := es.Error()
	for _, want := range []string{
		`[database] max_connections = "many": not an integer; allowed: an integer from 1 to 100`,
		`[api] read_timeout = "2h": out of range; allowed: a duration such as 30s, 5m or 1h30m from 1s to 1h0m0s`,
		`[api] auth_strategy = "keystone": not one of the choices; allowed: noauth, token`,
		`[webhook_source:batch] rate = "fast": not a number`,
		`[webhook_source:batch] colour = "blue": no such option in [webhook_source:*] sections`,
		`[webhook_source:batch] auth = "": is required; allowed: hmac, bearer, mtls`,
		`[webhook_source:]: templated section needs a name`,
		`[nosuch] option = "1": no such option`,
		`--set = "garbage": want SECTION.OPTION=VALUE`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("errors lack %q; got:\n%s", want, got)
		}
	}
	if strings.Contains(got, "hunter2") {
		t.Errorf("a secret leaked into errors:\n%s", got)
	}
}

func TestSecretMaskedInErrorsAndDump(t *testing.T) {
	g := NewGroup()
	g.Secret("database", "connection", "URL. Example: postgres://x")
	g.Int("database", "n", 1, 0, 5, "n. Example: 2")
	s := NewSet("X", g)
	v, err := s.Load(Source{Overrides: []string{"database.connection=postgres://u:hunter2@h/db"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range v.Dump() {
		if strings.Contains(line, "hunter2") {
			t.Errorf("Dump leaks a secret: %s", line)
		}
	}
	e := &Error{Section: "database", Option: "connection", Value: "postgres://u:hunter2@h/db", Problem: "bad", Secret: true}
	if strings.Contains(e.Error(), "hunter2") {
		t.Errorf("Error leaks a secret: %s", e)
	}
}

func TestTemplates(t *testing.T) {
	file := writeFile(t, "[webhook_source:b]\nauth = hmac\nsecret_files = /a, /b\n[webhook_source:a]\nauth = bearer\nrate = 2.5\n")
	s, _, _, _, _, _, _ := testSet()
	v, err := s.Load(Source{File: file})
	if err != nil {
		t.Fatal(err)
	}
	in := v.Instances("webhook_source")
	if len(in) != 2 || in[0].Name != "a" || in[1].Name != "b" {
		t.Fatalf("instances = %+v", in)
	}
	if in[0].String("auth") != "bearer" || in[0].Float("rate") != 2.5 || in[1].Float("rate") != 10 {
		t.Errorf("a: %q %v; b rate %v", in[0].String("auth"), in[0].Float("rate"), in[1].Float("rate"))
	}
	if got := in[1].List("secret_files"); !reflect.DeepEqual(got, []string{"/a", "/b"}) {
		t.Errorf("secret_files = %v", got)
	}
	if len(v.Warnings) != 0 {
		t.Errorf("warnings = %v", v.Warnings)
	}
}

func TestSampleDocumentsEveryOption(t *testing.T) {
	s, _, _, _, _, _, _ := testSet()
	var b strings.Builder
	if err := s.WriteSample(&b, "test"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, o := range s.Options() {
		if !strings.Contains(out, strings.TrimRight("#"+o.Name+" = "+o.Default, " ")+"\n") {
			t.Errorf("sample lacks %s", o.Name)
		}
	}
	for _, want := range []string{"[DEFAULT]", "# Environment: VGPU_TEST_DATABASE_MAX_CONNECTIONS", "# [webhook_source:NAME]", "# Allowed values: noauth, token"} {
		if !strings.Contains(out, want) {
			t.Errorf("sample lacks %q", want)
		}
	}
	if strings.Index(out, "[DEFAULT]") > strings.Index(out, "[api]") {
		t.Error("DEFAULT must come first")
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s")
	os.WriteFile(p, []byte("s3cret\n"), 0o640)
	got, err := ReadSecretFile(p)
	if err != nil || got != "s3cret" {
		t.Errorf("got %q, %v", got, err)
	}
	os.Chmod(p, 0o644)
	if _, err := ReadSecretFile(p); err == nil || !strings.Contains(err.Error(), "world-readable") {
		t.Errorf("world-readable secret accepted: %v", err)
	}
}

// TestConfigDir: the drop-ins of a --config-dir are read after the file,
// in name order, a later file's value winning, the same templated section
// in two files being one; files not named *.conf are left alone, and a
// typo in a drop-in is named like one in the file.
func TestConfigDir(t *testing.T) {
	file := writeFile(t, "[database]\nmax_connections = 4\nconnection = postgres://file\n[webhook_source:a]\nauth = hmac\nrate = 1\n")
	dir := t.TempDir()
	for name, body := range map[string]string{
		"10-db.conf":      "[database]\nmax_connections = 5\n[webhook_source:a]\nrate = 2\n",
		"20-db.conf":      "[database]\nmax_connections = 6\n",
		"30-api.conf":     "[api]\nread_timeout = 45\n",
		"99-old.conf.bak": "[database]\nmax_connections = 99\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, url, n, d, _, _, _ := testSet()
	v, err := s.Load(Source{File: file, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if n.Get(v) != 6 || url.Get(v) != "postgres://file" || d.Get(v) != 45*time.Second {
		t.Errorf("max_connections %d (want 6), connection %q, read_timeout %v", n.Get(v), url.Get(v), d.Get(v))
	}
	in := v.Instances("webhook_source")
	if len(in) != 1 || in[0].String("auth") != "hmac" || in[0].Float("rate") != 2 {
		t.Errorf("webhook_source instances %+v, want one: a, hmac, rate 2", in)
	}
	if src := v.Source("database", "max_connections"); !strings.Contains(src, "20-db.conf") {
		t.Errorf("source %q, want it to name the drop-ins", src)
	}

	// Env and flags still win over every file.
	v, err = s.Load(Source{File: file, Dir: dir, Overrides: []string{"database.max_connections=9"}})
	if err != nil || n.Get(v) != 9 {
		t.Errorf("flag over drop-ins: %d, %v", n.Get(v), err)
	}

	// A typo in a drop-in, and a missing directory.
	if err := os.WriteFile(filepath.Join(dir, "40-typo.conf"), []byte("[database]\nmax_conections = 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(Source{File: file, Dir: dir}); err == nil || !strings.Contains(err.Error(), "max_conections") {
		t.Errorf("typo in a drop-in: %v", err)
	}
	if _, err := s.Load(Source{Dir: filepath.Join(dir, "nope")}); err == nil || !strings.Contains(err.Error(), "--config-dir") {
		t.Errorf("missing directory: %v", err)
	}
}
