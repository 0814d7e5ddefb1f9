// SPDX-License-Identifier: Apache-2.0

package executor

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

type fakeBundler struct {
	instance string
	calls    int
}

func (f *fakeBundler) Bundle(_ context.Context, instance string, _ []string) (protocol.BundleDetails, error) {
	f.instance = instance
	f.calls++
	return protocol.BundleDetails{Bundle: []byte("tar.gz bytes"), BundleSHA256: "abc", Manifest: json.RawMessage(`{"parts":[]}`)}, nil
}

// TestCollectDiagnosticsBundle: the bundle goes out in the result but not
// into the journal; a duplicate delivery gets the journaled result,
// without the bundle, and does not collect again.
func TestCollectDiagnosticsBundle(t *testing.T) {
	en := newEnv(t)
	c := command(t, "diag", protocol.CollectDiagnostics, protocol.DiagnosticsParams{Bundle: true})
	wantStatus(t, en.exec(c), protocol.Failed, string(hosterr.Unsupported))

	b := &fakeBundler{}
	en.e.cfg.Bundler = b
	c = command(t, "diag2", protocol.CollectDiagnostics, protocol.DiagnosticsParams{Bundle: true})
	r := en.exec(c)
	wantStatus(t, r, protocol.Succeeded, "")
	var d protocol.BundleDetails
	if err := json.Unmarshal(r.Details, &d); err != nil || string(d.Bundle) != "tar.gz bytes" || d.BundleSHA256 != "abc" {
		t.Fatalf("details %s (%v)", r.Details, err)
	}
	if b.instance != dom1 {
		t.Errorf("bundle of %q, want the command's instance %s", b.instance, dom1)
	}
	ent, ok := en.j.Lookup("diag2")
	if !ok || ent.Result == nil {
		t.Fatal("not journaled")
	}
	if s := string(ent.Result.Details); strings.Contains(s, `"bundle"`) || !strings.Contains(s, "bundle_omitted") || !strings.Contains(s, "abc") {
		t.Errorf("journaled details %s", s)
	}
	dup := en.exec(c)
	wantStatus(t, dup, protocol.Succeeded, "")
	if b.calls != 1 || strings.Contains(string(dup.Details), `"bundle"`) {
		t.Errorf("duplicate: %d collections, details %s", b.calls, dup.Details)
	}
}
