// SPDX-License-Identifier: Apache-2.0

// Command oci builds the OCI image archives of the daemons with
// go-containerregistry, without a container daemon. `make image`: one
// layer holding vgpu-bridge's static binary, the policy files, the sample
// configuration, a CA bundle, /etc/passwd and /etc/group with the
// vgpu-bridge user (uid/gid 42800), /var/lib/vgpu-bridge and /tmp, and no
// shell. `make image-agent` (-daemon vgpu-agent -closure): the
// agent's dynamically linked binary with its shared-library closure as the
// build host's loader resolves it, run as root, /var/lib/vgpu-bridge/agent.
// Every timestamp is SOURCE_DATE_EPOCH (else the commit's time, else 0),
// so the same inputs give the same bytes.
//
//	go run ./packaging/oci -binary BIN -version V -revision C -o FILE.oci.tar
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"runtime"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "oci:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("oci", flag.ContinueOnError)
	var s Spec
	var out string
	var closure bool
	fl.StringVar(&s.Daemon, "daemon", Bridge, "the daemon the image runs: vgpu-bridge or vgpu-agent")
	fl.StringVar(&s.Binary, "binary", "", "the daemon's binary (vgpu-bridge: static, CGO_ENABLED=0)")
	fl.BoolVar(&closure, "closure", false, "copy the binary's shared libraries and interpreter as the build host's "+
		"dynamic loader resolves them (a dynamically linked binary)")
	fl.StringVar(&s.EtcDir, "etc", "etc/vgpu-bridge", "directory of rules.yaml, profiles.yaml, driver-compat.yaml and bridge.conf.sample")
	fl.StringVar(&s.CABundle, "ca", "/etc/ssl/certs/ca-certificates.crt", "CA bundle copied to /etc/ssl/certs/ca-certificates.crt")
	fl.StringVar(&s.Version, "version", "", "version: label, ref.name annotation and tag")
	fl.StringVar(&s.Revision, "revision", "", "commit of the sources (label org.opencontainers.image.revision)")
	fl.StringVar(&s.Source, "source", "https://github.com/vgpu-bridge/vgpu-bridge", "URL of the sources (label org.opencontainers.image.source)")
	fl.StringVar(&s.Name, "name", "localhost/vgpu-bridge", "image name podman load gives it (with the version as tag)")
	fl.StringVar(&s.Arch, "arch", runtime.GOARCH, "GOARCH the binary was built for")
	fl.StringVar(&out, "o", "", "output file (OCI layout in a tar)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if s.Binary == "" || s.Version == "" || out == "" || fl.NArg() > 0 {
		return fmt.Errorf("usage: oci [-daemon vgpu-agent -closure] -binary BIN -version VERSION [-revision COMMIT] -o FILE")
	}
	if closure {
		libs, err := Closure(s.Binary)
		if err != nil {
			return err
		}
		s.Libraries = libs
	}
	created, err := SourceDateEpoch(os.Getenv, GitCommitTime)
	if err != nil {
		return err
	}
	s.Created = created
	img, err := Image(s)
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := WriteArchive(w, img, Annotations(s), created); err != nil {
		f.Close()
		os.Remove(out)
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	digest, _ := img.Digest()
	fmt.Printf("%s (%.1f MiB, manifest %s, %s:%s)\n", out, float64(st.Size())/(1<<20), digest, s.Name, Tag(s.Version))
	return nil
}
