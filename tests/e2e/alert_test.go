package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const alertToken = "e2e-alertmanager-token-3c9d1f0a7b"

// alertPolicy: a firing alert whose gpu_util is high gives a VM without a
// vGPU a T4-1B on the direct path; its resolution gives the vGPU back, at
// most once per cooldown of the change.
func alertPolicy(string) string {
	return testsvc.DirectPolicy(`  - name: busy-alert-attaches
    on: [alert]
    when: event.status == "firing" && has(metrics.gpu_util) && metrics.gpu_util > 90.0 && instance.vgpu_count == 0
    then: ['attach("T4-1B", 1)']
  - name: resolved-alert-releases
    on: [alert]
    when: event.status == "resolved" && instance.vgpu_count > 0
    cooldown: 3s
    then: ['release()']
`)
}

// TestAlertDrivesVGPU: a real Alertmanager (Debian's) sends an alert
// annotated value "95" (alert_metrics maps it to gpu_util) for a VM: the
// bridge attaches a vGPU on the VM's host, once, though Alertmanager
// repeats the group every 2 s; when the alert is resolved after the
// rule's cooldown, the vGPU is released. Asserted in Placement, on the
// fake host, in the bridge and in Nova (expectHeld).
func TestAlertDrivesVGPU(t *testing.T) {
	bin := testsvc.AlertmanagerBinary(t)
	dir := t.TempDir()
	tok := filepath.Join(dir, "am.token")
	testsvc.Must(t, os.WriteFile(tok, []byte(alertToken+"\n"), 0o600), "token")
	w := newElasticWorldINI(t, "elastic-alert", alertPolicy, "\n[webhook_source:am]\nauth = bearer\nformat = alertmanager\ntoken_files = "+tok+
		"\nrate = 100\nburst = 100\nalert_metrics = value:gpu_util\n", elasticGPU{elasticGPUA, elasticFrom})
	vm := w.boot("e2e-alert")
	node := w.n.Allocations(t, vm)[w.root]
	am := testsvc.StartAlertmanager(t, bin, w.apiURL+"/v1/webhooks/am", alertToken)

	alert := map[string]any{"labels": map[string]string{"alertname": "GPUBusy", "instance_uuid": vm},
		"annotations": map[string]string{"value": "95", "summary": "the guest's GPU is busy"}}
	am.Post(t, []map[string]any{alert})
	w.waitFor(time.Minute, "the alert's vGPU attached", func() bool {
		atts := w.attachments(vm)
		return len(atts) == 1 && atts[0].State == "attached"
	})
	attachedAt := time.Now()
	w.expectHeld(vm, elasticGPUA, node)
	// Alertmanager repeats the group every 2 s: it acts once.
	time.Sleep(5 * time.Second)
	if atts := w.attachments(vm); len(atts) != 1 {
		t.Fatalf("attachments after the repeats: %+v, want the one", atts)
	}
	var repeats int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM requests WHERE source = 'webhook:am' AND code = 'repeated_alerts'`).Scan(&repeats), "repeats")
	if repeats < 1 {
		t.Errorf("no repeated notification recorded; Alertmanager should have repeated the group")
	}

	// Resolved after the cooldown: the vGPU goes back.
	if d := 3*time.Second - time.Since(attachedAt); d > 0 {
		time.Sleep(d)
	}
	alert["endsAt"] = time.Now().UTC().Add(-time.Second).Format(time.RFC3339Nano)
	am.Post(t, []map[string]any{alert})
	// The attachment reads released once the agent removed the mdev; the
	// claim goes from Placement just after, with the request's end.
	w.waitFor(time.Minute, "the vGPU released on the resolved alert, and its claim", func() bool {
		atts := w.attachments(vm)
		return len(atts) == 1 && atts[0].State == "released" && len(w.n.Allocations(t, vm)) == 1
	})
	w.expectHeld(vm, "", node)
}
