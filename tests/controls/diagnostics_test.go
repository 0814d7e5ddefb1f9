// SPDX-License-Identifier: Apache-2.0

package controls_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/diagnostics"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

type nextResults struct{ got []string }

func (n *nextResults) HandleResult(_ context.Context, r protocol.Result) error {
	n.got = append(n.got, r.CommandID)
	return nil
}

// TestDiagnosticsStore: a request queues its collect_diagnostics command
// (no request, bundle: true) with its record and audit row; each way an
// agent can answer (a bundle, a failure, a success without a bundle, no
// answer, a bundle whose digest is wrong, a duplicate) ends as it should,
// and the command's row never keeps the bundle.
func TestDiagnosticsStore(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	_, err := pool.Exec(ctx, `INSERT INTO hosts (name) VALUES ('cmp-1')`)
	testsvc.Must(t, err, "host")
	now := time.Now()
	st := &diagnostics.Store{Pool: pool, Now: func() time.Time { return now }}
	who := controls.Actor{Name: "ops", RequestID: "req-1"}

	if _, err := st.Request(ctx, who, "no-such-host", "", 0); !errors.Is(err, diagnostics.ErrNotFound) {
		t.Fatalf("unknown host: %v", err)
	}
	bundle := []byte("\x1f\x8b fake tar.gz")
	sum := sha256.Sum256(bundle)
	digest := hex.EncodeToString(sum[:])
	withBundle := func(d string) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"bundle": bundle, "bundle_sha256": d, "manifest": map[string]any{"parts": []any{}}})
		return b
	}
	for _, tc := range []struct {
		name    string
		answer  func(cmdID string)
		after   time.Duration // clock moved before reading
		status  string
		errPart string
	}{
		{"bundle", func(id string) {
			res := protocol.Result{V: 1, CommandID: id, Host: "cmp-1", Status: protocol.Succeeded, Details: withBundle(digest)}
			r := diagnostics.Results{Store: st, Next: &nextResults{}}
			testsvc.Must(t, r.HandleResult(ctx, res), "bundle")
			testsvc.Must(t, r.HandleResult(ctx, res), "duplicate") // ignored
		}, 0, diagnostics.Complete, ""},
		{"wrong digest", func(id string) {
			testsvc.Must(t, st.TakeBundle(ctx, protocol.Result{V: 1, CommandID: id, Host: "cmp-1", Status: protocol.Succeeded,
				Details: withBundle(strings.Repeat("0", 64))}), "bundle")
		}, 0, diagnostics.Failed, "digest"},
		{"agent failed", func(id string) {
			body, _ := json.Marshal(protocol.Result{CommandID: id, Status: protocol.Failed, Code: "unsupported", Message: "no bundler configured"})
			testsvc.Must(t, requests.FinishCommand(ctx, pool, id, "failed", body), "finish")
		}, 0, diagnostics.Failed, "(unsupported): no bundler configured"},
		{"old agent", func(id string) {
			testsvc.Must(t, requests.FinishCommand(ctx, pool, id, "succeeded", []byte(`{"details":{"diagnostics":{}}}`)), "finish")
		}, 0, diagnostics.Failed, "without a bundle"},
		{"no answer", func(string) {}, 11 * time.Minute, diagnostics.Failed, "no answer"},
		{"pending", func(string) {}, 0, diagnostics.Pending, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now = time.Now()
			d, err := st.Request(ctx, who, "cmp-1", "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01", 0)
			testsvc.Must(t, err, "request")
			if d.Status != diagnostics.Pending || d.RequestedBy != "ops" {
				t.Fatalf("new record %+v", d)
			}
			var kind string
			var params protocol.DiagnosticsParams
			var hasReq bool
			testsvc.Must(t, pool.QueryRow(ctx, `SELECT kind, body->'params', request_id IS NOT NULL FROM commands WHERE id::text = $1`,
				d.CommandID).Scan(&kind, &params, &hasReq), "command")
			if kind != "collect_diagnostics" || !params.Bundle || hasReq {
				t.Fatalf("command %s %+v request=%v", kind, params, hasReq)
			}
			tc.answer(d.CommandID)
			now = now.Add(tc.after)
			got, err := st.Get(ctx, d.ID)
			testsvc.Must(t, err, "get")
			if got.Status != tc.status || !strings.Contains(got.Error, tc.errPart) {
				t.Fatalf("status %s error %q, want %s with %q", got.Status, got.Error, tc.status, tc.errPart)
			}
			_, b, ok, err := st.Bundle(ctx, d.ID)
			testsvc.Must(t, err, "bundle")
			if ok != (tc.status == diagnostics.Complete) || ok && (string(b) != string(bundle) || got.SHA256 != digest || got.Size != int64(len(bundle))) {
				t.Fatalf("bundle ok=%v %q %+v", ok, b, got)
			}
			var kept *string
			testsvc.Must(t, pool.QueryRow(ctx, `SELECT result::text FROM commands WHERE id::text = $1`, d.CommandID).Scan(&kept), "result")
			if kept != nil && strings.Contains(*kept, `"bundle"`) {
				t.Fatalf("the command's row keeps the bundle: %s", *kept)
			}
		})
	}
	var audited int
	testsvc.Must(t, pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action = 'host.diagnostics' AND object_id = 'cmp-1'
		AND actor = 'ops' AND request_id = 'req-1'`).Scan(&audited), "audit")
	if audited != 6 {
		t.Errorf("audit rows %d, want 6", audited)
	}
	// A result without a bundle goes on to the pipeline.
	next := &nextResults{}
	testsvc.Must(t, diagnostics.Results{Store: st, Next: next}.HandleResult(ctx, protocol.Result{CommandID: "x", Status: protocol.Succeeded}), "next")
	if len(next.got) != 1 {
		t.Errorf("a result without a bundle did not reach the pipeline: %v", next.got)
	}
}
