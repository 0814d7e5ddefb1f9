// Package repo checks the repository as a whole: it documents itself and
// points at nothing outside it.
package repo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
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
	}
}

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
