// Package repo checks the repository as a whole: it documents itself and
// points at nothing outside it.
package repo

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// files lists the tracked files (git ls-files), or every file when the
// tree is not a git checkout.
func files(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = dir
	if out, err := cmd.Output(); err == nil {
		return strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	}
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error { //nolint:errcheck
		if err == nil && d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// TestNoReferenceOutsideTheRepository: no file names a path outside the
// repository (a sibling checkout's design notes or data): what the
// project needs, it holds, and says where it came from.
func TestNoReferenceOutsideTheRepository(t *testing.T) {
	dir := root(t)
	// Spelt in pieces so that this file does not match itself.
	forbidden := []string{".." + "/shared", "shared" + "/corpus", "DESIGN" + ".md", "STYLE" + ".md", "/work" + "/main"}
	for _, f := range files(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || bytes.IndexByte(b, 0) >= 0 {
			continue // gone from the work tree, or binary
		}
		for _, s := range forbidden {
			if i := bytes.Index(b, []byte(s)); i >= 0 {
				line := bytes.Count(b[:i], []byte("\n")) + 1
				t.Errorf("%s:%d refers to %q, outside the repository", f, line, s)
			}
		}
		// A tracker's issue number means nothing to a reader of the
		// code; an upstream project's issue is named with its project
		// and "#" ("eventlet issue #432").
		if loc := trackerIssue.FindIndex(b); loc != nil {
			line := bytes.Count(b[:loc[0]], []byte("\n")) + 1
			t.Errorf("%s:%d refers to %q, an issue tracker outside the repository: say it in the repository's own docs", f, line, b[loc[0]:loc[1]])
		}
	}
}

// trackerIssue is a bare issue number (the word, a space, digits), spelt so that this
// file does not match itself.
var trackerIssue = regexp.MustCompile(`(?i)\bissues?` + ` [0-9]+\b`)

// TestCopiedTestDataNamesItsSource: test data copied from other projects
// says from where: project, path, commit and licence.
func TestCopiedTestDataNamesItsSource(t *testing.T) {
	dir := root(t)
	for _, d := range []string{"nova/testdata", "agent/libvirt/testdata", "bridge/webhook/testdata", "tests/webhook/testdata"} {
		b, err := os.ReadFile(filepath.Join(dir, d, "README"))
		if err != nil {
			t.Errorf("%s: %v", d, err)
			continue
		}
		s := string(b)
		if !strings.Contains(s, "commit") || !(strings.Contains(s, "License") || strings.Contains(s, "LGPL") || strings.Contains(s, "MIT")) {
			t.Errorf("%s/README names no upstream commit or licence:\n%s", d, s)
		}
	}
}

// TestDocsBuild: the documentation builds with Sphinx, warnings as errors
// (make docs does the same).
func TestDocsBuild(t *testing.T) {
	bin, err := exec.LookPath("sphinx-build")
	if err != nil {
		t.Fatal("sphinx-build not found: `make services` installs python3-sphinx (apt-get install python3-sphinx)")
	}
	dir := root(t)
	out, err := exec.Command(bin, "-W", "-q", "-b", "html", filepath.Join(dir, "doc", "source"), t.TempDir()).CombinedOutput()
	if err != nil {
		t.Fatalf("sphinx-build -W: %v\n%s", err, out)
	}
}

// TestReadmesParse: the READMEs are reStructuredText without a warning
// (a stray indented line renders as an error block on every forge), read
// with docutils, which python3-sphinx brings.
func TestReadmesParse(t *testing.T) {
	dir := root(t)
	const check = `import sys, docutils.core
for p in sys.argv[1:]:
    docutils.core.publish_doctree(open(p).read(), source_path=p, settings_overrides={"report_level": 2, "halt_level": 2})`
	cmd := exec.Command("python3", "-c", check, "README.rst", filepath.Join("tests", "README.rst"))
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.rst or tests/README.rst does not parse cleanly (`make services` installs python3-sphinx, which brings docutils): %v\n%s", err, out)
	}
}

// TestDebPackages: make deb builds the three packages; lintian finds no
// error in them and no binary without a manual page; unpacked, they hold
// the binaries (each runs and says its version), manual pages, units,
// samples, copyright and conffiles, and their maintainer scripts never
// start or enable a service.
func TestDebPackages(t *testing.T) {
	for _, tool := range []string{"lintian", "dpkg-deb", "dpkg-shlibdeps", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: `make services` installs it (apt-get install lintian dpkg-dev make)", tool)
		}
	}
	dir := root(t)
	out := t.TempDir()
	build := exec.Command("make", "deb", "DEB_DIR="+out) // not build/deb: tests/keystone's TestInstall builds at the same time
	build.Dir = dir
	build.Env = append(os.Environ(), "VERSION=0.1.0.dev0+test")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, b)
	}
	want := map[string][]string{
		"vgpu-bridge": {"usr/bin/vgpu-bridge", "lib/systemd/system/vgpu-bridge.service", "lib/systemd/system/vgpu-bridge-migrate.service",
			"usr/lib/sysusers.d/vgpu-bridge.conf", "etc/vgpu-bridge/rules.yaml", "usr/share/doc/vgpu-bridge/examples/bridge.conf.sample",
			"usr/share/doc/vgpu-bridge/examples/policy.yaml.sample", "usr/share/doc/vgpu-bridge/copyright", "usr/share/vgpu-bridge/prometheus/vgpu-bridge.rules.yaml"},
		"vgpu-agent": {"usr/bin/vgpu-agent", "lib/systemd/system/vgpu-agent.service", "lib/systemd/system/vgpu-agent-restore.service", "lib/systemd/system/vgpu-agent-layout.service",
			"usr/share/doc/vgpu-agent/examples/agent.conf.sample",
			"usr/share/doc/vgpu-agent/copyright"},
		"vgpuctl": {"usr/bin/vgpuctl", "usr/share/doc/vgpuctl/copyright", "usr/share/man/man1/vgpuctl.1.gz",
			"usr/share/man/man1/vgpuctl-flavor-plan.1.gz", "usr/share/bash-completion/completions/vgpuctl",
			"usr/share/zsh/vendor-completions/_vgpuctl"},
	}
	want["vgpu-bridge"] = append(want["vgpu-bridge"], "usr/share/man/man8/vgpu-bridge.8.gz", "usr/share/man/man8/vgpu-bridge-upgrade-check.8.gz")
	want["vgpu-agent"] = append(want["vgpu-agent"], "usr/share/man/man8/vgpu-agent.8.gz", "usr/share/man/man8/vgpu-agent-serve.8.gz",
		"usr/share/man/man8/vgpu-agent-restore-devices.8.gz", "usr/share/man/man8/vgpu-agent-layout-apply.8.gz")
	for pkg, files := range want {
		debs, _ := filepath.Glob(filepath.Join(out, pkg+"_0.1.0~dev0+test_*.deb"))
		if len(debs) != 1 {
			t.Errorf("%s: packages %v", pkg, debs)
			continue
		}
		deb := debs[0]
		b, err := exec.Command("lintian", "--fail-on", "error", deb).CombinedOutput()
		if err != nil {
			t.Errorf("lintian %s: %v\n%s", filepath.Base(deb), err, b)
		}
		if strings.Contains(string(b), "no-manual-page") {
			t.Errorf("lintian %s: a binary without its manual page:\n%s", filepath.Base(deb), b)
		}
		// Every binary is bound at start (BIND_NOW) but the agent, whose
		// override says why (go-nvml's lazily bound NVML).
		if strings.Contains(string(b), "hardening-no-bindnow") {
			t.Errorf("lintian %s: a binary without BIND_NOW:\n%s", filepath.Base(deb), b)
		}
		x := filepath.Join(t.TempDir(), pkg)
		if b, err := exec.Command("dpkg-deb", "-R", deb, x).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb -R %s: %v\n%s", deb, err, b)
		}
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(x, f)); err != nil {
				t.Errorf("%s lacks %s", pkg, f)
			}
		}
		checkUnitDocs(t, pkg, x)
		for _, script := range []string{"postinst", "postrm", "preinst", "prerm"} {
			b, err := os.ReadFile(filepath.Join(x, "DEBIAN", script))
			if err != nil {
				continue
			}
			var code strings.Builder // without comments, which may tell the operator what to run
			for _, line := range strings.Split(string(b), "\n") {
				if !strings.HasPrefix(strings.TrimSpace(line), "#") {
					code.WriteString(line + "\n")
				}
			}
			for _, bad := range []string{"systemctl start", "systemctl enable", "systemctl restart", "deb-systemd-invoke", "invoke-rc.d"} {
				if strings.Contains(code.String(), bad) {
					t.Errorf("%s's %s runs %q: packages never start a service unasked", pkg, script, bad)
				}
			}
		}
		if pkg == "vgpu-bridge" {
			c, _ := os.ReadFile(filepath.Join(x, "DEBIAN", "conffiles"))
			if !strings.Contains(string(c), "/etc/vgpu-bridge/rules.yaml") {
				t.Errorf("conffiles = %q", c)
			}
		}
		// Each packaged binary starts (the dynamic loader accepts it) and
		// says its version.
		v, err := exec.Command(filepath.Join(x, "usr", "bin", pkg), "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(v), pkg+" 0.1.0.dev0+test") {
			t.Errorf("packaged %s --version: %v %s", pkg, err, v)
		}
	}
}

// TestNoInitRegistration: the daemons' code has no init function. Options,
// checks and commands are declared beside the code that uses them and
// assembled explicitly where each binary is wired (bridge.Options,
// agent.Options, the commands' subcommands lists), so that what a daemon
// is made of can be read in one place. Test files may keep theirs.
func TestNoInitRegistration(t *testing.T) {
	dir := root(t)
	for _, tree := range []string{"bridge", "agent", "cmd"} {
		err := filepath.WalkDir(filepath.Join(dir, tree), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "init" {
					rel, _ := filepath.Rel(dir, p)
					t.Errorf("%s: func init(): declare options in a conf.Group, commands in the subcommands list", rel)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// checkUnitDocs: each Documentation= of the package's units names a file
// or a manual page the package itself installs.
func checkUnitDocs(t *testing.T, pkg, x string) {
	t.Helper()
	units, _ := filepath.Glob(filepath.Join(x, "lib/systemd/system/*.service"))
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(line, "Documentation=")
			if !ok {
				continue
			}
			for _, doc := range strings.Fields(v) {
				var path string
				switch {
				case strings.HasPrefix(doc, "file:"):
					path = strings.TrimPrefix(doc, "file:")
				case strings.HasPrefix(doc, "man:"):
					name, sect, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(doc, "man:"), ")"), "(")
					if !ok {
						t.Errorf("%s: %s: Documentation=%s is not man:NAME(SECTION)", pkg, filepath.Base(u), doc)
						continue
					}
					path = fmt.Sprintf("/usr/share/man/man%s/%s.%s.gz", sect, name, sect)
				default:
					continue // a URL
				}
				if _, err := os.Stat(filepath.Join(x, path)); err != nil {
					t.Errorf("%s: %s: Documentation=%s, which the package does not install", pkg, filepath.Base(u), doc)
				}
			}
		}
	}
}
