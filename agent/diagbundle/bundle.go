// SPDX-License-Identifier: Apache-2.0

// Package diagbundle gathers a host's evidence for a failed vGPU into one
// tar.gz (the bundle of collect_diagnostics): the diagnose checks, the
// output of nvidia-bug-report.sh, domain XML, the kernel's NVRM lines,
// mdev and VF sysfs state, the agent's log tail and journal, its version
// and its configuration with secrets removed, and a MANIFEST.json that
// lists every part, its size, and what was skipped or truncated and why.
// The bundle stays within a size limit: the largest parts are truncated
// first.
package diagbundle

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// DefaultMaxBytes is the default bound on a bundle (gzip-compressed).
const DefaultMaxBytes = 16 << 20

// Part names in the bundle.
const (
	PartDiagnose  = "diagnose.json"
	PartBugReport = "nvidia-bug-report.log.gz"
	PartNVRM      = "nvrm.log"
	PartSysfs     = "sysfs.txt"
	PartAgentLog  = "agent.log"
	PartJournal   = "journal.json"
	PartVersion   = "version.txt"
	PartConfig    = "agent.conf"
	PartManifest  = "MANIFEST.json"
	domainsDir    = "domains/"
)

// Diagnoser runs the diagnose checks (agent/diagnose.Diagnoser).
type Diagnoser interface {
	Diagnose(ctx context.Context, checks []string) (json.RawMessage, error)
}

// DomainXMLs returns the XML of the domain instance, or, when instance is
// empty, of every domain with a vGPU, by domain UUID.
type DomainXMLs interface {
	DomainXMLs(ctx context.Context, instance string) (map[string]string, error)
}

// Collector gathers bundles. Nil or empty sources make their part
// skipped, with the reason in the manifest.
type Collector struct {
	Diagnoser Diagnoser
	Domains   DomainXMLs
	// BugReportTool is nvidia-bug-report.sh's name (looked up on PATH) or
	// path; BugReportTimeout bounds its run.
	BugReportTool    string
	BugReportTimeout time.Duration
	// NVRMFile, when set, is read instead of running dmesg (its NVRM
	// lines are kept).
	NVRMFile string
	// SysfsRoot is the root of sysfs (a fake tree in tests).
	SysfsRoot string
	// LogFile is the agent's log file; its tail is kept.
	LogFile string
	// Journal returns the agent's journal of commands and devices as JSON.
	Journal func() ([]byte, error)
	// Version is the agent's version text.
	Version string
	// Config is the agent's configuration dump (conf.Values.Dump lines);
	// ScrubConfig is applied to it.
	Config []string
	// MaxBytes bounds the bundle; 0 takes DefaultMaxBytes.
	MaxBytes int
	Log      *slog.Logger
}

// Part is one file of the bundle.
type Part struct {
	Name string
	Data []byte
	// KeepTail truncates from the start (logs: the newest lines matter).
	KeepTail bool
	// Skipped says why the part is missing.
	Skipped string
	// Truncated says why the part was cut.
	Truncated    string
	OriginalSize int
}

// ManifestEntry is one part in MANIFEST.json.
type ManifestEntry struct {
	Name         string `json:"name"`
	Size         int    `json:"size"`
	OriginalSize int    `json:"original_size,omitempty"`
	Skipped      string `json:"skipped,omitempty"`
	Truncated    string `json:"truncated,omitempty"`
}

// Manifest is MANIFEST.json.
type Manifest struct {
	Instance    string          `json:"instance,omitempty"`
	CollectedAt time.Time       `json:"collected_at"`
	MaxBytes    int             `json:"max_bytes"`
	Parts       []ManifestEntry `json:"parts"`
}

// Collect gathers the parts for instance (empty: every domain with a vGPU)
// and returns the bundle and its manifest.
func (c *Collector) Collect(ctx context.Context, instance string, checks []string) ([]byte, Manifest, error) {
	var parts []Part
	add := func(name string, data []byte, err error, tail bool) {
		p := Part{Name: name, Data: data, KeepTail: tail}
		if err != nil {
			p.Skipped, p.Data = err.Error(), nil
		}
		parts = append(parts, p)
	}
	d, err := c.diagnose(ctx, checks)
	add(PartDiagnose, d, err, false)
	b, err := c.bugReport(ctx)
	add(PartBugReport, b, err, false)
	parts = append(parts, c.domains(ctx, instance)...)
	n, err := c.nvrm(ctx)
	add(PartNVRM, n, err, true)
	s, err := SysfsState(c.SysfsRoot)
	add(PartSysfs, s, err, false)
	l, err := c.logTail()
	add(PartAgentLog, l, err, true)
	j, err := c.journal()
	add(PartJournal, j, err, false)
	add(PartVersion, []byte(c.Version+"\n"), nil, false)
	add(PartConfig, []byte(strings.Join(ScrubConfig(c.Config), "\n")+"\n"), nil, false)
	m := Manifest{Instance: instance, CollectedAt: time.Now().UTC().Truncate(time.Second), MaxBytes: c.maxBytes()}
	out, err := Build(parts, &m)
	return out, m, err
}

func (c *Collector) maxBytes() int {
	if c.MaxBytes <= 0 {
		return DefaultMaxBytes
	}
	return c.MaxBytes
}

func (c *Collector) diagnose(ctx context.Context, checks []string) ([]byte, error) {
	if c.Diagnoser == nil {
		return nil, errors.New("no diagnoser configured")
	}
	raw, err := c.Diagnoser.Diagnose(ctx, checks)
	if err != nil {
		return nil, fmt.Errorf("diagnose: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return raw, nil
	}
	return buf.Bytes(), nil
}

// bugReport runs nvidia-bug-report.sh --output-file DIR/nvidia-bug-report.log,
// which writes DIR/nvidia-bug-report.log.gz.
func (c *Collector) bugReport(ctx context.Context) ([]byte, error) {
	tool := c.BugReportTool
	if tool == "" {
		return nil, errors.New("no nvidia-bug-report tool configured")
	}
	path, err := exec.LookPath(tool)
	if err != nil {
		return nil, fmt.Errorf("%s not found: %w", tool, err)
	}
	dir, err := os.MkdirTemp("", "vgpu-bug-report-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	timeout := c.BugReportTimeout
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	base := filepath.Join(dir, "nvidia-bug-report.log")
	cmd := exec.CommandContext(rctx, path, "--output-file", base)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if rctx.Err() != nil {
		return nil, fmt.Errorf("%s did not finish within %v", tool, timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", tool, err, lastLine(out))
	}
	if gz, err := os.ReadFile(base + ".gz"); err == nil {
		return gz, nil
	}
	plain, err := os.ReadFile(base)
	if err != nil {
		return nil, fmt.Errorf("%s wrote no report: %w", tool, err)
	}
	return gzipBytes(plain)
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (c *Collector) domains(ctx context.Context, instance string) []Part {
	if c.Domains == nil {
		return []Part{{Name: domainsDir, Skipped: "no libvirt connection configured"}}
	}
	xs, err := c.Domains.DomainXMLs(ctx, instance)
	if err != nil {
		return []Part{{Name: domainsDir, Skipped: fmt.Sprintf("libvirt: %v", err)}}
	}
	if len(xs) == 0 {
		why := "no domain with a vGPU"
		if instance != "" {
			why = "domain " + instance + " not found"
		}
		return []Part{{Name: domainsDir, Skipped: why}}
	}
	var out []Part
	for _, id := range slices.Sorted(mapKeys(xs)) {
		out = append(out, Part{Name: domainsDir + filepath.Base(id) + ".xml", Data: []byte(xs[id])})
	}
	return out
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// nvrm returns the kernel's NVRM lines, from NVRMFile or dmesg.
func (c *Collector) nvrm(ctx context.Context) ([]byte, error) {
	var raw []byte
	var err error
	if c.NVRMFile != "" {
		raw, err = os.ReadFile(c.NVRMFile)
	} else {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		raw, err = exec.CommandContext(dctx, "dmesg").Output()
	}
	if err != nil {
		return nil, fmt.Errorf("kernel log: %w", err)
	}
	var out bytes.Buffer
	for line := range strings.Lines(string(raw)) {
		if strings.Contains(line, "NVRM") {
			out.WriteString(line)
		}
	}
	return out.Bytes(), nil
}

func (c *Collector) logTail() ([]byte, error) {
	if c.LogFile == "" {
		return nil, errors.New("no log file configured ([diagnostics] log_file)")
	}
	b, err := os.ReadFile(c.LogFile)
	if err != nil {
		return nil, err
	}
	return []byte(ScrubText(string(b))), nil
}

func (c *Collector) journal() ([]byte, error) {
	if c.Journal == nil {
		return nil, errors.New("no journal")
	}
	return c.Journal()
}
