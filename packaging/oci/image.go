// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// UID and GID of the vgpu-bridge user in the image. Kolla numbers its
// services' users from 42400 up (42491 its last, skyline, and 42480 is its
// tempest user); 42800 is well above that block, so the bridge's files on
// a kolla host belong to no kolla service's user.
const (
	UID = 42800
	GID = 42800
)

// Paths and settings of the images.
const (
	BinaryPath = "/usr/bin/vgpu-bridge"
	ConfigPath = "/etc/vgpu-bridge/bridge.conf"
	StateDir   = "/var/lib/vgpu-bridge"
	APIPort    = "9797/tcp"
	// RefNameAnnotation is the OCI index annotation that skopeo
	// (oci-archive:FILE:REF) selects an image by.
	RefNameAnnotation = "org.opencontainers.image.ref.name"
	// ContainerdNameAnnotation names the image when podman loads the
	// archive (podman prefers it to ref.name, which for a bare version
	// would not be a valid image reference).
	ContainerdNameAnnotation = "io.containerd.image.name"
)

// The agent's image: it runs as root (etc/systemd/vgpu-agent.service says
// why: sysfs writes, libvirtd's root socket, NVML's administrative calls),
// its binary is dynamically linked (libvirt's client library through cgo),
// so the image carries the binary's shared-library closure, and NVML is the
// host's driver library, mounted at run time.
const (
	AgentBinaryPath = "/usr/bin/vgpu-agent"
	AgentConfigPath = "/etc/vgpu-bridge/agent.conf"
	AgentStateDir   = "/var/lib/vgpu-bridge/agent"
	AgentPort       = "9798/tcp"
)

// Daemons an image can be built for.
const (
	Bridge = "vgpu-bridge"
	Agent  = "vgpu-agent"
)

// profile is what differs between the daemons' images.
type profile struct {
	binary, config, stateDir, port string
	uid, gid                       int
	etc                            []string // files of EtcDir copied to /etc/vgpu-bridge
	samples                        []string // files of EtcDir copied to the examples
}

func profileOf(daemon string) (profile, error) {
	switch daemon {
	case Bridge, "":
		return profile{binary: BinaryPath, config: ConfigPath, stateDir: StateDir, port: APIPort, uid: UID, gid: GID,
			etc:     []string{"rules.yaml", "profiles.yaml", "driver-compat.yaml"},
			samples: []string{"bridge.conf.sample", "policy.yaml.sample"}}, nil
	case Agent:
		return profile{binary: AgentBinaryPath, config: AgentConfigPath, stateDir: AgentStateDir, port: AgentPort,
			samples: []string{"agent.conf.sample"}}, nil
	}
	return profile{}, fmt.Errorf("no image for daemon %q (vgpu-bridge or vgpu-agent)", daemon)
}

// Spec is what an image is built from.
type Spec struct {
	Daemon string // Bridge (the default) or Agent
	Binary string // the daemon's binary: static for the bridge
	EtcDir string // etc/vgpu-bridge of the repository
	// Libraries are the binary's shared libraries and its program
	// interpreter, paths on the build host (Closure lists them), copied to
	// the same paths in the image. Empty for a static binary.
	Libraries []string
	CABundle  string // the build host's CA bundle
	Version   string
	Revision  string // the commit
	Source    string // the repository's URL
	Name      string // repository part of the image name, e.g. localhost/vgpu-bridge
	Arch      string // GOARCH of Binary
	Created   time.Time
}

// file is one entry of the layer.
type file struct {
	name     string // without leading slash; directories end in "/"
	mode     int64
	uid, gid int
	body     []byte
}

// SourceDateEpoch is the build's timestamp: $SOURCE_DATE_EPOCH when set,
// else the time of commit (when commitTime gives one), else the Unix epoch.
func SourceDateEpoch(getenv func(string) string, commitTime func() (int64, error)) (time.Time, error) {
	if s := strings.TrimSpace(getenv("SOURCE_DATE_EPOCH")); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: not a non-negative integer", s)
		}
		return time.Unix(n, 0).UTC(), nil
	}
	if commitTime != nil {
		if n, err := commitTime(); err == nil {
			return time.Unix(n, 0).UTC(), nil
		}
	}
	return time.Unix(0, 0).UTC(), nil
}

// GitCommitTime is the committer time of HEAD in the current directory.
func GitCommitTime() (int64, error) {
	out, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
}

// Passwd and Group are the bridge image's /etc/passwd and /etc/group.
func Passwd() string {
	return "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		fmt.Sprintf("vgpu-bridge:x:%d:%d:vgpu-bridge:%s:/usr/sbin/nologin\n", UID, GID, StateDir) +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

func Group() string {
	return "root:x:0:\n" +
		fmt.Sprintf("vgpu-bridge:x:%d:\n", GID) +
		"nogroup:x:65534:\n"
}

// AgentPasswd and AgentGroup are the agent image's: root runs it.
func AgentPasswd() string {
	return "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

func AgentGroup() string { return "root:x:0:\nnogroup:x:65534:\n" }

// Closure lists binary's shared libraries and program interpreter as the
// build host's dynamic loader (the binary's PT_INTERP) resolves them:
// ld.so --list, which runs nothing of the binary's own code. The image then
// holds every file the binary needs to start and nothing else of the
// build host's.
func Closure(binary string) ([]string, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return nil, fmt.Errorf("%s: program interpreter: %w", binary, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return nil, fmt.Errorf("%s is statically linked: it has no shared libraries to copy", binary)
	}
	out, err := exec.Command(interp, "--list", binary).Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list %s: %w", interp, binary, err)
	}
	return parseClosure(string(out))
}

// parseClosure reads ld.so --list's lines: "name => /path (0x…)" for a
// library, "/path (0x…)" for the interpreter, "name (0x…)" for the vDSO
// (no file). A library it could not find ("not found") is an error.
func parseClosure(out string) ([]string, error) {
	var libs []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("shared library %s", line)
		}
		_, p, ok := strings.Cut(line, "=> ")
		if !ok {
			p = line
		}
		p, _, _ = strings.Cut(p, " (")
		if strings.HasPrefix(p, "/") {
			libs = append(libs, p)
		}
	}
	sort.Strings(libs)
	return slices.Compact(libs), nil
}

// files lists the layer's entries, parents included, sorted by name.
func files(s Spec) ([]file, error) {
	prof, err := profileOf(s.Daemon)
	if err != nil {
		return nil, err
	}
	read := func(p string) ([]byte, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("image input: %w", err)
		}
		return b, nil
	}
	type src struct {
		dst  string
		path string
		mode int64
	}
	srcs := []src{
		{prof.binary, s.Binary, 0o755},
		{"/etc/ssl/certs/ca-certificates.crt", s.CABundle, 0o644},
	}
	for _, name := range prof.etc {
		srcs = append(srcs, src{"/etc/vgpu-bridge/" + name, filepath.Join(s.EtcDir, name), 0o644})
	}
	for _, name := range prof.samples {
		srcs = append(srcs, src{"/usr/share/doc/" + path.Base(prof.binary) + "/examples/" + name, filepath.Join(s.EtcDir, name), 0o644})
	}
	for _, lib := range s.Libraries { // a link's target's bytes, at the link's path
		srcs = append(srcs, src{lib, lib, 0o755})
	}
	byName := map[string]file{}
	for _, f := range srcs {
		b, err := read(f.path)
		if err != nil {
			return nil, err
		}
		byName[strings.TrimPrefix(f.dst, "/")] = file{name: strings.TrimPrefix(f.dst, "/"), mode: f.mode, body: b}
	}
	passwd, group := Passwd(), Group()
	if prof.uid == 0 {
		passwd, group = AgentPasswd(), AgentGroup()
	}
	byName["etc/passwd"] = file{name: "etc/passwd", mode: 0o644, body: []byte(passwd)}
	byName["etc/group"] = file{name: "etc/group", mode: 0o644, body: []byte(group)}
	byName["tmp/"] = file{name: "tmp/", mode: 0o1777}
	state := strings.TrimPrefix(prof.stateDir, "/") + "/"
	byName[state] = file{name: state, mode: 0o750, uid: prof.uid, gid: prof.gid}
	// Parents: root-owned 0755.
	for name := range byName {
		for d := path.Dir(strings.TrimSuffix(name, "/")); d != "."; d = path.Dir(d) {
			if _, ok := byName[d+"/"]; !ok {
				byName[d+"/"] = file{name: d + "/", mode: 0o755}
			}
		}
	}
	out := make([]file, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// LayerTar is the image's one layer, uncompressed: the same inputs give the
// same bytes (sorted entries, every time the build's, numeric owners only).
func LayerTar(s Spec) ([]byte, error) {
	fs, err := files(s)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range fs {
		h := &tar.Header{
			Name:    f.name,
			Mode:    f.mode,
			Uid:     f.uid,
			Gid:     f.gid,
			ModTime: s.Created,
			Format:  tar.FormatPAX,
		}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Tag is version as an image tag ([A-Za-z0-9_.-], at most 128 characters):
// PEP 440's "+" of a development version becomes "-".
func Tag(version string) string {
	b := []byte(version)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	t := string(b)
	if t == "" || t[0] == '.' || t[0] == '-' {
		t = "v" + t
	}
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// Labels are the image's OCI labels.
func Labels(s Spec) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    cmp.Or(s.Daemon, Bridge),
		"org.opencontainers.image.version":  s.Version,
		"org.opencontainers.image.revision": s.Revision,
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.source":   s.Source,
		"org.opencontainers.image.created":  s.Created.Format(time.RFC3339),
	}
}

// Image builds the image: one layer (LayerTar) and its configuration.
func Image(s Spec) (v1.Image, error) {
	if s.Version == "" {
		return nil, errors.New("no version")
	}
	prof, err := profileOf(s.Daemon)
	if err != nil {
		return nil, err
	}
	raw, err := LayerTar(s)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: s.Created}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	base, err = mutate.ConfigFile(base, &v1.ConfigFile{
		Architecture: s.Arch,
		OS:           "linux",
		Created:      created,
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint:   []string{prof.binary},
			Cmd:          []string{"serve", "--config", prof.config},
			User:         fmt.Sprintf("%d:%d", prof.uid, prof.gid),
			WorkingDir:   prof.stateDir,
			Env:          []string{"PATH=/usr/bin"},
			ExposedPorts: map[string]struct{}{prof.port: {}},
			Labels:       Labels(s),
			StopSignal:   "SIGTERM",
		},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   created,
			CreatedBy: "make image (packaging/oci): " + cmp.Or(s.Daemon, Bridge) + " " + s.Version,
		},
	})
}

// Annotations are those of the image's entry in the layout's index.json.
func Annotations(s Spec) map[string]string {
	return map[string]string{
		RefNameAnnotation:        s.Version,
		ContainerdNameAnnotation: s.Name + ":" + Tag(s.Version),
	}
}

// WriteArchive writes img as an OCI image layout packed in a tar (what
// `podman load -i` and `skopeo copy oci-archive:` read) to w; every entry
// has the time created, sorted names and root ownership.
func WriteArchive(w io.Writer, img v1.Image, annotations map[string]string, created time.Time) error {
	dir, err := os.MkdirTemp("", "vgpu-bridge-oci-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := WriteLayout(dir, img, annotations); err != nil {
		return err
	}
	return tarDir(w, dir, created)
}

// WriteLayout writes img into dir as an OCI image layout, its entry in
// index.json carrying annotations.
func WriteLayout(dir string, img v1.Image, annotations map[string]string) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(annotations))
}

// tarDir writes the tree under dir (its contents, not dir itself) to w.
func tarDir(w io.Writer, dir string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			rel += "/"
		} else if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		names = append(names, rel)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, name := range names {
		h := &tar.Header{Name: name, ModTime: mtime, Format: tar.FormatPAX}
		if strings.HasSuffix(name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, st.Size()
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
