// SPDX-License-Identifier: Apache-2.0

package image_test

import (
	"archive/tar"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestAgentImage checks `make image-agent`: the agent's image holds its
// dynamically linked binary with exactly the shared libraries and program
// interpreter the binary names (nothing else of the build host: no shell),
// runs as root with the agent's configuration and state paths, and the
// binary starts inside the unpacked layer alone (chroot), so no library
// it needs is missing from the image.
func TestAgentImage(t *testing.T) {
	dir := t.TempDir()
	archive := makeTarget(t, "image-agent", dir, "vgpu-agent")
	img := readImageNamed(t, archive, "localhost/vgpu-agent:0.1.0.dev0-test")
	if err := validate.Image(img); err != nil {
		t.Fatalf("image does not validate: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/bin/vgpu-agent"}) ||
		!slices.Equal(c.Cmd, []string{"serve", "--config", "/etc/vgpu-bridge/agent.conf"}) ||
		c.User != "0:0" || c.WorkingDir != "/var/lib/vgpu-bridge/agent" || c.Labels["org.opencontainers.image.title"] != "vgpu-agent" {
		t.Errorf("config: Entrypoint %q Cmd %q User %q WorkingDir %q title %q", c.Entrypoint, c.Cmd, c.User, c.WorkingDir,
			c.Labels["org.opencontainers.image.title"])
	}
	if _, ok := c.ExposedPorts["9798/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("ExposedPorts %v, want 9798/tcp alone (/metrics, /healthz, /readyz)", c.ExposedPorts)
	}

	rootfs := t.TempDir()
	entries := unpackAll(t, img, rootfs)
	bin := filepath.Join(rootfs, "usr/bin/vgpu-agent")
	// What the layer holds beyond the agent's own files is what the
	// binary needs: its interpreter and the libraries its closure names.
	needed := neededClosure(t, bin)
	own := []string{"usr/bin/vgpu-agent", "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt",
		"usr/share/doc/vgpu-agent/examples/agent.conf.sample"}
	for _, e := range entries {
		if strings.HasSuffix(e, "/") || slices.Contains(own, e) {
			continue
		}
		if !needed["/"+e] {
			t.Errorf("the layer holds %s, which the agent's closure does not name", e)
		}
	}
	for lib := range needed {
		if !slices.Contains(entries, strings.TrimPrefix(lib, "/")) {
			t.Errorf("the layer lacks %s, which the agent needs", lib)
		}
	}
	if !slices.ContainsFunc(entries, func(e string) bool { return strings.Contains(e, "libvirt.so.") }) {
		t.Error("the layer holds no libvirt client library")
	}
	for _, sh := range []string{"bin/sh", "usr/bin/sh", "bin/bash", "bin/busybox"} {
		if slices.Contains(entries, sh) {
			t.Errorf("the layer holds %s", sh)
		}
	}
	if t.Failed() {
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal("running the agent inside its unpacked layer needs chroot: run the tests as root, as make test does")
	}
	for _, args := range [][]string{{"--version"}, {"genconfig", "--config", ""}} {
		cmd := exec.Command("/usr/bin/vgpu-agent", args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
		cmd.Dir = "/"
		cmd.Env = c.Env
		out, err := cmd.CombinedOutput()
		if err != nil || (args[0] == "--version" && !strings.Contains(string(out), version)) ||
			(args[0] == "genconfig" && !strings.Contains(string(out), "[DEFAULT]")) {
			t.Errorf("vgpu-agent %q in the image alone: %v\n%.2000s", args, err, out)
		}
	}
}

// neededClosure is the set of files the dynamic loader resolves for bin
// (its libraries and its interpreter), read on this machine.
func neededClosure(t *testing.T, bin string) map[string]bool {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(p.Open())
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		t.Fatal("the agent is statically linked; the image expects libvirt's client library through cgo")
	}
	out, err := exec.Command(interp, "--list", bin).Output()
	if err != nil {
		t.Fatalf("%s --list: %v", interp, err)
	}
	got := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		_, p, ok := strings.Cut(strings.TrimSpace(line), "=> ")
		if !ok {
			p = strings.TrimSpace(line)
		}
		p, _, _ = strings.Cut(p, " (")
		if strings.HasPrefix(p, "/") {
			got[p] = true
		}
	}
	if !got[interp] {
		t.Errorf("%s --list does not name the interpreter", interp)
	}
	return got
}

// unpackAll writes the one layer's files into rootfs and returns its
// entry names.
func unpackAll(t *testing.T, img v1.Image, rootfs string) []string {
	t.Helper()
	var names []string
	eachEntry(t, img, rootfs, func(h *tar.Header) { names = append(names, h.Name) })
	return names
}
