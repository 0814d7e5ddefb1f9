package pipeline_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestFrameRateLimitOnDirectPath: a workload's frame-rate limiter reaches
// the vGPU the agent creates (nvidia/vgpu_params on the fake host, before
// the attach), off for one workload and on for another, and the request
// says so.
func TestFrameRateLimitOnDirectPath(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest)+`workloads:
  streaming: {series: [Q], choose: smallest, frame_rate_limit: false}
  desktop:   {series: [Q], choose: smallest, frame_rate_limit: true}
`)
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	for _, tc := range []struct {
		inst, workload, want string
	}{
		{w.domains[3].UUID, "streaming", "frame_rate_limiter=0"},
		{w.domains[4].UUID, "desktop", "frame_rate_limiter=1"},
	} {
		id := w.submit("GPU_REQUEST", tc.inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1, "workload": tc.workload})
		r := w.wait(id, 60*time.Second)
		if r.State != requests.Succeeded {
			t.Fatalf("%s request %s: %s (%s: %s)", tc.workload, id, r.State, r.Code, r.Reason)
		}
		atts := w.attachments(tc.inst)
		if len(atts) != 1 {
			t.Fatalf("%s: attachments %+v, want one", tc.workload, atts)
		}
		if got, err := fakehost.VGPUParams(w.fake, atts[0].id); got != tc.want || err != nil {
			t.Errorf("%s: vgpu_params of mdev %s = %q (%v), want %q", tc.workload, atts[0].id, got, err, tc.want)
		}
		var reasons string
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(string_agg(detail::text, ' | '), '') FROM audit_log WHERE request_id = $1`,
			id.String()).Scan(&reasons), "audit")
		if !strings.Contains(reasons, "frame-rate limiter "+map[bool]string{true: "on", false: "off"}[tc.want == "frame_rate_limiter=1"]) {
			t.Errorf("%s: the request's history does not name the limiter: %s", tc.workload, reasons)
		}
	}
}
