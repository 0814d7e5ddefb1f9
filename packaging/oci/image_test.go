// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func TestSourceDateEpoch(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "SOURCE_DATE_EPOCH" {
				return v
			}
			return ""
		}
	}
	commit := func() (int64, error) { return 1234, nil }
	noGit := func() (int64, error) { return 0, errors.New("not a git checkout") }
	for _, c := range []struct {
		env    string
		commit func() (int64, error)
		want   int64
		bad    bool
	}{
		{"1700000000", commit, 1700000000, false},
		{" 42\n", noGit, 42, false},
		{"", commit, 1234, false},
		{"", noGit, 0, false},
		{"", nil, 0, false},
		{"yesterday", commit, 0, true},
		{"-1", commit, 0, true},
	} {
		got, err := SourceDateEpoch(env(c.env), c.commit)
		if c.bad {
			if err == nil {
				t.Errorf("SOURCE_DATE_EPOCH=%q: no error", c.env)
			}
			continue
		}
		if err != nil || !got.Equal(time.Unix(c.want, 0)) || got.Location() != time.UTC {
			t.Errorf("SOURCE_DATE_EPOCH=%q: %v, %v; want %d UTC", c.env, got, err, c.want)
		}
	}
}

func TestTag(t *testing.T) {
	for in, want := range map[string]string{
		"0.1.0":             "0.1.0",
		"0.1.0.dev0+abc123": "0.1.0.dev0-abc123",
		"v1.2.3-4-gdead":    "v1.2.3-4-gdead",
		".x":                "v.x",
		"":                  "v",
	} {
		if got := Tag(in); got != want {
			t.Errorf("Tag(%q) = %q, want %q", in, got, want)
		}
	}
}

// spec is a Spec on small stand-in files.
func spec(t *testing.T) Spec {
	t.Helper()
	dir := t.TempDir()
	for _, n := range []string{"bin", "rules.yaml", "profiles.yaml", "driver-compat.yaml", "bridge.conf.sample", "policy.yaml.sample", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("content of "+n+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return Spec{
		Binary: filepath.Join(dir, "bin"), EtcDir: dir, CABundle: filepath.Join(dir, "ca.crt"),
		Version: "1.2.3.dev0+abc", Revision: "abc", Source: "https://example.org/src",
		Name: "localhost/vgpu-bridge", Arch: "amd64", Created: time.Unix(1700000000, 0).UTC(),
	}
}

func TestLayerTarIsSortedAndStamped(t *testing.T) {
	s := spec(t)
	a, err := LayerTar(s)
	if err != nil {
		t.Fatal(err)
	}
	// Files rewritten later (new mtimes, other modes) give the same bytes.
	time.Sleep(10 * time.Millisecond)
	if err := os.Chmod(s.Binary, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := LayerTar(s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two layers of the same inputs differ")
	}
	tr := tar.NewReader(bytes.NewReader(a))
	prev := ""
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if h.Name <= prev {
			t.Errorf("%s after %s: not sorted", h.Name, prev)
		}
		prev = h.Name
		if !h.ModTime.Equal(s.Created) || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %v, owner names %q/%q", h.Name, h.ModTime, h.Uname, h.Gname)
		}
	}
	if n != 23 {
		t.Errorf("%d entries, want 23", n)
	}
}

func TestWriteArchiveIsReproducible(t *testing.T) {
	s := spec(t)
	var out [2]bytes.Buffer
	for i := range out {
		img, err := Image(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteArchive(&out[i], img, Annotations(s), s.Created); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		t.Fatal("two archives of the same inputs differ")
	}
	var names []string
	tr := tar.NewReader(&out[0])
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	// blobs/, blobs/sha256/, three blobs (config, layer, manifest), index.json, oci-layout.
	if len(names) != 7 || names[0] != "blobs/" || names[5] != "index.json" || names[6] != "oci-layout" {
		t.Errorf("archive entries %v", names)
	}
}

func TestLayoutValidates(t *testing.T) {
	s := spec(t)
	img, err := Image(s)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteLayout(dir, img, Annotations(s)); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations[RefNameAnnotation] != s.Version ||
		im.Manifests[0].Annotations[ContainerdNameAnnotation] != "localhost/vgpu-bridge:1.2.3.dev0-abc" {
		t.Errorf("index.json manifests %+v", im.Manifests)
	}
}

// TestParseClosure reads ld.so --list's three kinds of line (a library, the
// interpreter, the vDSO, which is no file) and refuses a missing library.
func TestParseClosure(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n" +
		"\tlibvirt.so.0 => /lib/x86_64-linux-gnu/libvirt.so.0 (0x00007f10)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f20)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f30)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f20)\n"
	got, err := parseClosure(out)
	want := []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libvirt.so.0", "/lib64/ld-linux-x86-64.so.2"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("parseClosure = %q, %v; want %q", got, err, want)
	}
	if _, err := parseClosure("\tlibnvidia-ml.so.1 => not found\n"); err == nil || !strings.Contains(err.Error(), "libnvidia-ml") {
		t.Errorf("a library not found: %v, want an error naming it", err)
	}
}
