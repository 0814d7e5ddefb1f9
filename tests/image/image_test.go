// SPDX-License-Identifier: Apache-2.0

// Package image_test checks `make image`: the OCI image archive of
// vgpu-bridge, read back with go-containerregistry (configuration, the one
// layer's exact file list, the same bytes from two builds), and the
// binary taken out of the layer run against the real services.
package image_test

import (
	"archive/tar"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	version = "0.1.0.dev0+test"
	epoch   = 1700000000
)

// The layer's entries: name, mode, owner. Nothing else: no shell, no
// other binary.
var wantEntries = []string{
	"etc/ 755 0:0",
	"etc/group 644 0:0",
	"etc/passwd 644 0:0",
	"etc/ssl/ 755 0:0",
	"etc/ssl/certs/ 755 0:0",
	"etc/ssl/certs/ca-certificates.crt 644 0:0",
	"etc/vgpu-bridge/ 755 0:0",
	"etc/vgpu-bridge/driver-compat.yaml 644 0:0",
	"etc/vgpu-bridge/profiles.yaml 644 0:0",
	"etc/vgpu-bridge/rules.yaml 644 0:0",
	"tmp/ 1777 0:0",
	"usr/ 755 0:0",
	"usr/bin/ 755 0:0",
	"usr/bin/vgpu-bridge 755 0:0",
	"usr/share/ 755 0:0",
	"usr/share/doc/ 755 0:0",
	"usr/share/doc/vgpu-bridge/ 755 0:0",
	"usr/share/doc/vgpu-bridge/examples/ 755 0:0",
	"usr/share/doc/vgpu-bridge/examples/bridge.conf.sample 644 0:0",
	"usr/share/doc/vgpu-bridge/examples/policy.yaml.sample 644 0:0",
	"var/ 755 0:0",
	"var/lib/ 755 0:0",
	"var/lib/vgpu-bridge/ 750 42800:42800",
}

const (
	wantPasswd = "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"vgpu-bridge:x:42800:42800:vgpu-bridge:/var/lib/vgpu-bridge:/usr/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	wantGroup = "root:x:0:\nvgpu-bridge:x:42800:\nnogroup:x:65534:\n"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// makeImage runs `make image` into dir and returns the archive's path.
func makeImage(t *testing.T, dir string) string {
	t.Helper()
	return makeTarget(t, "image", dir, "vgpu-bridge")
}

// makeTarget runs `make target` into dir and returns the path of daemon's
// archive.
func makeTarget(t *testing.T, target, dir, daemon string) string {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", target, "IMAGE_DIR="+dir)
	cmd.Dir = repoRoot(t)
	// Not a surrounding make's flags (make test), nor a developer's IMAGE_*.
	for _, e := range os.Environ() {
		k, _, _ := strings.Cut(e, "=")
		if k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" && !strings.HasPrefix(k, "IMAGE_") && !strings.HasPrefix(k, "AGENT_IMAGE_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, "VERSION="+version, fmt.Sprintf("SOURCE_DATE_EPOCH=%d", epoch))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s IMAGE_DIR=%s: %v\n%s", target, dir, err, out)
	}
	path := filepath.Join(dir, daemon+"-"+version+".oci.tar")
	if !strings.Contains(string(out), path) {
		t.Errorf("make %s does not print the archive's path %s:\n%s", target, path, out)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("make %s: %s, %.1f MiB, in %v", target, path, float64(st.Size())/(1<<20), time.Since(start).Round(100*time.Millisecond))
	return path
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// untar unpacks the archive at path (regular files and directories only)
// into dir.
func untar(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			t.Fatalf("archive entry %q outside the layout", h.Name)
		}
		dst := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			w, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(w, tr); err != nil {
				t.Fatal(err)
			}
			w.Close()
		default:
			t.Fatalf("archive entry %s of type %c", h.Name, h.Typeflag)
		}
	}
}

// readImage reads the archive's one image back, checking index.json's
// annotations.
func readImage(t *testing.T, archive string) v1.Image {
	t.Helper()
	return readImageNamed(t, archive, "localhost/vgpu-bridge:0.1.0.dev0-test")
}

// readImageNamed reads the archive's one image back, checking index.json's
// annotations: the version, and name as the name podman load gives.
func readImageNamed(t *testing.T, archive, name string) v1.Image {
	t.Helper()
	dir := t.TempDir()
	untar(t, archive, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("not an OCI image layout: %v", err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("layout does not validate: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(im.Manifests))
	}
	d := im.Manifests[0]
	if d.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", d.MediaType)
	}
	if got := d.Annotations["org.opencontainers.image.ref.name"]; got != version {
		t.Errorf("ref.name annotation %q, want %q", got, version)
	}
	if got := d.Annotations["io.containerd.image.name"]; got != name {
		t.Errorf("io.containerd.image.name annotation %q (the name podman load gives)", got)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func checkConfig(t *testing.T, img v1.Image) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	created := time.Unix(epoch, 0).UTC()
	if !cf.Created.Time.Equal(created) || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("created %v os %s arch %s; want %v linux %s", cf.Created.Time, cf.OS, cf.Architecture, created, runtime.GOARCH)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/bin/vgpu-bridge"}) {
		t.Errorf("Entrypoint %q", c.Entrypoint)
	}
	if !slices.Equal(c.Cmd, []string{"serve", "--config", "/etc/vgpu-bridge/bridge.conf"}) {
		t.Errorf("Cmd %q", c.Cmd)
	}
	if c.User != "42800:42800" || c.WorkingDir != "/var/lib/vgpu-bridge" {
		t.Errorf("User %q WorkingDir %q", c.User, c.WorkingDir)
	}
	if _, ok := c.ExposedPorts["9797/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("ExposedPorts %v, want 9797/tcp alone", c.ExposedPorts)
	}
	if !slices.Equal(c.Env, []string{"PATH=/usr/bin"}) {
		t.Errorf("Env %q", c.Env)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.title":    "vgpu-bridge",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.source":   "https://github.com/vgpu-bridge/vgpu-bridge",
		"org.opencontainers.image.created":  created.Format(time.RFC3339),
	} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	if rev := c.Labels["org.opencontainers.image.revision"]; rev == "" {
		t.Error("no org.opencontainers.image.revision label")
	}
	if len(cf.History) != 1 || !cf.History[0].Created.Time.Equal(created) {
		t.Errorf("history %+v", cf.History)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest: config %s, layers %+v; want an OCI config and one OCI gzip layer", m.Config.MediaType, m.Layers)
	}
}

// unpackLayer checks the one layer's entries and writes its files into
// rootfs.
func unpackLayer(t *testing.T, img v1.Image, rootfs string) {
	t.Helper()
	var got []string
	eachEntry(t, img, rootfs, func(h *tar.Header) {
		got = append(got, fmt.Sprintf("%s %o %d:%d", h.Name, h.Mode, h.Uid, h.Gid))
		if !h.ModTime.Equal(time.Unix(epoch, 0)) {
			t.Errorf("%s: mtime %v, want SOURCE_DATE_EPOCH", h.Name, h.ModTime)
		}
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner names %q:%q, want numeric owners only", h.Name, h.Uname, h.Gname)
		}
	})
	if !slices.Equal(got, wantEntries) {
		t.Errorf("layer entries:\n%s\nwant exactly:\n%s", strings.Join(got, "\n"), strings.Join(wantEntries, "\n"))
	}
	for _, sh := range []string{"bin/sh", "usr/bin/sh", "bin/busybox"} {
		if slices.ContainsFunc(got, func(e string) bool { return strings.HasPrefix(e, sh+" ") }) {
			t.Errorf("the layer holds %s", sh)
		}
	}
}

// eachEntry writes the one layer's files and directories into rootfs and
// calls fn with each entry's header; any other kind of entry is an error.
func eachEntry(t *testing.T, img v1.Image, rootfs string, fn func(*tar.Header)) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h)
		dst := filepath.Join(rootfs, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, os.FileMode(h.Mode)&0o755); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("%s: entry of type %c; the layer holds files and directories only", h.Name, h.Typeflag)
		}
	}
}

func checkFiles(t *testing.T, rootfs string) {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read(filepath.Join(rootfs, "etc/passwd")); got != wantPasswd {
		t.Errorf("/etc/passwd:\n%s\nwant:\n%s", got, wantPasswd)
	}
	if got := read(filepath.Join(rootfs, "etc/group")); got != wantGroup {
		t.Errorf("/etc/group:\n%s\nwant:\n%s", got, wantGroup)
	}
	etc := testbridge.EtcDir()
	for dst, src := range map[string]string{
		"etc/vgpu-bridge/rules.yaml":                            filepath.Join(etc, "rules.yaml"),
		"etc/vgpu-bridge/profiles.yaml":                         filepath.Join(etc, "profiles.yaml"),
		"etc/vgpu-bridge/driver-compat.yaml":                    filepath.Join(etc, "driver-compat.yaml"),
		"usr/share/doc/vgpu-bridge/examples/bridge.conf.sample": filepath.Join(etc, "bridge.conf.sample"),
		"usr/share/doc/vgpu-bridge/examples/policy.yaml.sample": filepath.Join(etc, "policy.yaml.sample"),
		"etc/ssl/certs/ca-certificates.crt":                     "/etc/ssl/certs/ca-certificates.crt",
	} {
		if read(filepath.Join(rootfs, dst)) != read(src) {
			t.Errorf("/%s differs from %s", dst, src)
		}
	}
	bin := filepath.Join(rootfs, "usr/bin/vgpu-bridge")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("/usr/bin/vgpu-bridge: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Error("/usr/bin/vgpu-bridge is dynamically linked; the image has no libc (CGO_ENABLED=0)")
		}
	}
	if s := f.Section(".symtab"); s != nil {
		t.Error("/usr/bin/vgpu-bridge has a symbol table; -ldflags '-s -w' strips it")
	}
}

func TestImage(t *testing.T) {
	// Two builds, each into its own directory (not build/, which is the
	// developer's), give the same bytes.
	first := makeImage(t, t.TempDir())
	second := makeImage(t, t.TempDir())
	if a, b := sha256File(t, first), sha256File(t, second); a != b {
		t.Errorf("two builds of the same inputs differ: sha256 %s and %s", a, b)
	}

	img := readImage(t, first)
	if err := validate.Image(img); err != nil {
		t.Fatalf("image does not validate: %v", err)
	}
	checkConfig(t, img)
	rootfs := t.TempDir()
	unpackLayer(t, img, rootfs)
	checkFiles(t, rootfs)
	if t.Failed() {
		return
	}

	bin := filepath.Join(rootfs, "usr/bin/vgpu-bridge")
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), version) {
		t.Fatalf("vgpu-bridge --version = %q, %v; want the version %s", out, err, version)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	serve(t, rootfs, cf.Config.Cmd)
}

// serve runs the image's binary with the image's Cmd (its configuration
// file written in a temporary directory, and the image's policy files)
// against the real services, checks / and /healthz, and stops it with
// SIGTERM.
func serve(t *testing.T, rootfs string, cmdArgs []string) {
	t.Helper()
	db := testsvc.MigratedPostgres(t)
	addr := fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))
	conf := filepath.Join(t.TempDir(), "bridge.conf")
	if err := os.WriteFile(conf, []byte("[api]\nlisten = "+addr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range cmdArgs {
		args = append(args, strings.Replace(a, "/etc/vgpu-bridge/bridge.conf", conf, 1))
	}
	etc := filepath.Join(rootfs, "etc", "vgpu-bridge")
	overrides := testbridge.Overrides(t, db,
		"policy.rules_file="+filepath.Join(etc, "rules.yaml"),
		"policy.profiles_file="+filepath.Join(etc, "profiles.yaml"),
		"policy.driver_compat_file="+filepath.Join(etc, "driver-compat.yaml"))
	for _, s := range overrides {
		if strings.HasPrefix(s, "api.listen=") {
			continue // the configuration file's
		}
		args = append(args, "--set", s)
	}
	logPath := filepath.Join(t.TempDir(), "bridge.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(rootfs, "usr/bin/vgpu-bridge"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
			<-done
		}
	})
	fail := func(format string, a ...any) {
		t.Helper()
		log, _ := os.ReadFile(logPath)
		t.Fatalf("%s\nvgpu-bridge %s\nlog:\n%s", fmt.Sprintf(format, a...), strings.Join(args, " "), testsvc.LastLines(string(log), 30))
	}

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, []byte, error) {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	// Ready: the database, the broker and Placement answer the image's binary.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, body, err := get("/readyz")
		if code == http.StatusOK {
			break
		}
		select {
		case err := <-done:
			stopped = true
			fail("vgpu-bridge exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			fail("/readyz not 200 within 2m: %d %s %v", code, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, body, err := get("/healthz")
	if err != nil || code != http.StatusOK {
		fail("/healthz = %d %s %v", code, body, err)
	}
	// The image's own health command (no shell, no curl in it): the
	// configuration the daemon reads names the listener it asks.
	hc := exec.Command(filepath.Join(rootfs, "usr/bin/vgpu-bridge"), append([]string{"healthcheck", "--ready"}, args[1:]...)...)
	if out, err := hc.CombinedOutput(); err != nil || !strings.Contains(string(out), "healthy: http://"+addr+"/readyz 200") {
		fail("vgpu-bridge healthcheck --ready = %v:\n%s", err, out)
	}
	code, body, err = get("/")
	var doc struct {
		Versions []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"versions"`
		Build map[string]string `json:"build"`
	}
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &doc) != nil {
		fail("/ = %d %s %v", code, body, err)
	}
	if len(doc.Versions) != 1 || doc.Versions[0].ID != "v1" || doc.Versions[0].Status != "CURRENT" || doc.Build["version"] != version {
		t.Errorf("/ is not the version document of %s: %s", version, body)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		stopped = true
		if err != nil {
			fail("vgpu-bridge exited with %v on SIGTERM, want 0", err)
		}
	case <-time.After(40 * time.Second):
		fail("vgpu-bridge did not exit within 40s of SIGTERM")
	}
}
