// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/vgpu-bridge/vgpu-bridge/agent/diagbundle"
	"github.com/vgpu-bridge/vgpu-bridge/agent/executor"
	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	ver "github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// bundler gathers collect_diagnostics bundles (executor.Bundler).
type bundler struct{ c *diagbundle.Collector }

// Bundler returns the drivers' diagnostics bundler, with the [diagnostics]
// options, the journal j and the configuration v (dumped with secrets
// masked).
func (d *Drivers) Bundler(v *conf.Values, j *journal.Journal) executor.Bundler {
	s := diagnosticsFrom(v)
	c := &diagbundle.Collector{Diagnoser: d.Diagnoser(v), BugReportTool: s.Tool, BugReportTimeout: s.ToolTimeout,
		NVRMFile: s.KernelLogFile, LogFile: s.LogFile, MaxBytes: s.MaxBytes, Version: ver.String("vgpu-agent"),
		Config: v.Dump(),
		Journal: func() ([]byte, error) {
			return json.MarshalIndent(map[string]any{"devices": j.Devices(), "pending": j.Pending()}, "", "  ")
		}}
	if d.Sysfs != nil {
		c.SysfsRoot = d.Sysfs.Root()
	}
	if d.Libvirt != nil {
		c.Domains = domainXMLs{conn: d.Libvirt}
	}
	return &bundler{c: c}
}

func (b *bundler) Bundle(ctx context.Context, instance string, checks []string) (protocol.BundleDetails, error) {
	out, m, err := b.c.Collect(ctx, instance, checks)
	if err != nil {
		return protocol.BundleDetails{}, err
	}
	man, err := json.Marshal(m)
	if err != nil {
		return protocol.BundleDetails{}, err
	}
	sum := sha256.Sum256(out)
	return protocol.BundleDetails{Bundle: out, BundleSHA256: hex.EncodeToString(sum[:]), Manifest: man}, nil
}

// domainXMLs reads domain XML through libvirt: the instance's, else every
// domain's with a hostdev (a vGPU).
type domainXMLs struct{ conn *libvirt.Conn }

func (d domainXMLs) DomainXMLs(ctx context.Context, instance string) (map[string]string, error) {
	out := map[string]string{}
	if instance != "" {
		x, err := d.conn.DomainXML(ctx, instance)
		if hosterr.Is(err, hosterr.NotFound) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out[instance] = x
		return out, nil
	}
	doms, err := d.conn.Domains(ctx)
	if err != nil {
		return nil, err
	}
	for _, dom := range doms {
		if len(dom.Hostdevs) == 0 {
			continue
		}
		x, err := d.conn.DomainXML(ctx, dom.UUID)
		if hosterr.Is(err, hosterr.NotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[dom.UUID] = x
	}
	return out, nil
}
