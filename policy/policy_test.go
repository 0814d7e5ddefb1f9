package policy

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func testCatalog(t testing.TB) *catalog.Catalog {
	t.Helper()
	c, err := catalog.LoadFile("testdata/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCompat(t testing.TB) *Compat {
	t.Helper()
	c, err := LoadCompatFile("testdata/driver-compat.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testPolicy(t testing.TB) *Policy {
	t.Helper()
	p, err := LoadFile("testdata/test-policy.yaml", Options{Catalog: testCatalog(t), Compat: testCompat(t), Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// fleet: two T4 hosts, KVM 470 and 535; one A40 host.
func fleet() *MemState {
	return &MemState{
		HostList: []Host{
			{Name: "cmp1", Hypervisor: "KVM (QEMU 6)", DriverVersion: "470.82.01", GPUs: []GPU{{Address: "0000:81:00.0", Model: "T4", Profile: "T4-4Q", Used: 1, Capacity: 4, Scheduler: "best_effort"}}},
			{Name: "cmp2", Hypervisor: "KVM", DriverVersion: "535.104.06", GPUs: []GPU{{Address: "0000:41:00.0", Model: "T4"}}},
		},
		Instances: []Instance{
			{UUID: "vm-none", ProjectID: "p1", Host: "cmp1", State: "active"},
			{UUID: "vm-4q", ProjectID: "p1", Host: "cmp1", State: "active", VGPUs: []VGPU{{Profile: "T4-4Q", Count: 1, GPU: "0000:81:00.0"}}},
			{UUID: "vm-live", ProjectID: "live", Host: "cmp1", State: "active"},
			{UUID: "vm-small", ProjectID: "small", Host: "cmp1", State: "active", VGPUs: []VGPU{{Profile: "T4-4Q", Count: 1, GPU: "0000:81:00.0"}}},
		},
		Usage: map[string]Usage{
			"p1":    {VGPUs: 1, FramebufferMiB: 4096},
			"small": {VGPUs: 1, FramebufferMiB: 4096},
			"full":  {VGPUs: 8, FramebufferMiB: 8 * 1024},
		},
	}
}

func kinds(d *Decision) string {
	var parts []string
	for _, in := range d.Intents {
		parts = append(parts, in.summary())
	}
	return strings.Join(parts, "; ")
}

func TestRuleKinds(t *testing.T) {
	p := testPolicy(t)
	st := fleet()
	tests := []struct {
		name       string
		ev         Event
		want       string // intents, summarised
		rejected   string // reason prefix, "" = not rejected
		wantRefuse string // a refusal reason fragment
	}{
		{"attach training largest C", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "training"},
			`attach T4-16C x1 mode=nova-resize trait=CUSTOM_NVIDIA_321 [rule request]; set_limits cpu_max="800000 100000" memory_high="64G" [rule limits]`, "", ""},
		{"attach inference smallest C", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "inference"},
			"attach T4-4C x1 mode=nova-resize trait=CUSTOM_NVIDIA_319 [rule request]", "", ""},
		{"attach rendering min 2 GiB", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "rendering"},
			"attach T4-2Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_231 [rule request]", "", ""},
		{"attach vdi smallest B/Q", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "vdi"},
			"attach T4-1B x1 mode=nova-resize trait=CUSTOM_NVIDIA_222 [rule request]", "", ""},
		{"attach gaming keeps frame-rate limiter", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "gaming"},
			"attach T4-1Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_230 frame_rate_limit=on [rule request]", "", ""},
		{"attach requested profile and count", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "GRID T4-8Q", Count: 2},
			"attach T4-8Q x2 mode=nova-resize trait=CUSTOM_NVIDIA_233 [rule request]", "", ""},
		{"profile attach mode", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "T4-16Q"},
			"attach T4-16Q x1 mode=direct-cold trait=CUSTOM_NVIDIA_234 [rule request]", "", ""},
		{"project attach mode and workload override", Event{Kind: KindGPURequest, InstanceUUID: "vm-live", Workload: "training"},
			`attach T4-8C x1 mode=direct-live trait=CUSTOM_NVIDIA_320 [rule request]; set_limits cpu_max="800000 100000" memory_high="64G" [rule limits]`, "", ""},
		{"project+profile attach mode", Event{Kind: KindGPURequest, InstanceUUID: "vm-live", Profile: "T4-8Q"},
			"attach T4-8Q x1 mode=direct-cold trait=CUSTOM_NVIDIA_233 [rule request]", "", ""},
		{"unknown profile", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "T4-3Q"},
			`reject "no vGPU profile fits" [rule no-fit]`, "no vGPU profile fits", ""},
		{"reject wins, notify kept", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "vdi", Labels: map[string]string{"banned": "1"}},
			`notify "banned request" [rule deny-banned]; reject "project is banned from vGPUs" [rule deny-banned]`, "project is banned", "rule deny-banned rejected the event"},
		{"release all", Event{Kind: KindGPURelease, InstanceUUID: "vm-4q"},
			"release T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule release]", "", ""},
		{"release on nova delete (prefix)", Event{Kind: "nova.instance.delete.end", InstanceUUID: "vm-4q"},
			"release T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule release]", "", ""},
		{"release nothing held", Event{Kind: KindGPURelease, InstanceUUID: "vm-none"}, "", "", ""},
		{"resize", Event{Kind: KindGPUResize, InstanceUUID: "vm-4q", Profile: "T4-8Q"},
			"resize to T4-8Q mode=nova-resize trait=CUSTOM_NVIDIA_233 [rule resize]", "", ""},
		{"resize to same", Event{Kind: KindGPUResize, InstanceUUID: "vm-4q", Profile: "T4-4Q"},
			"", "the instance already has T4-4Q", "already has"},
		{"resize without vGPU", Event{Kind: KindGPUResize, InstanceUUID: "vm-none", Profile: "T4-4Q"},
			"", "the instance holds no vGPU to resize", ""},
		{"tune by operator rule", Event{Kind: KindGPURequest, InstanceUUID: "vm-4q", Profile: "T4-4Q", Workload: "rendering"},
			"attach T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule request]; tune scheduler=equal_share timeslice_us=2000 clocks_mhz=0 gpus=0000:81:00.0 [rule render-share]", "", ""},
		{"conflicting operator tunes", Event{Kind: KindGPURequest, InstanceUUID: "vm-4q", Profile: "T4-4Q", Workload: "rendering", Source: "farm"},
			"attach T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule request]; tune scheduler=equal_share timeslice_us=2000 clocks_mhz=0 gpus=0000:81:00.0 [rule render-share]", "", "conflicts with rule render-share"},
		// The sender's tuning becomes the tenant's intent (the bridge refuses
		// it when another tenant's vGPU shares the GPU).
		{"tune request by the tenant", Event{Kind: KindGPURequest, InstanceUUID: "vm-4q", Profile: "T4-4Q", Source: "sched", Tune: &TuneRequest{Scheduler: "fixed_share"}},
			"attach T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule request]; tune scheduler=fixed_share timeslice_us=0 clocks_mhz=0 by=tenant gpus=0000:81:00.0 [rule (request from sched)]", "", ""},
		{"tune request against an operator rule", Event{Kind: KindGPURequest, InstanceUUID: "vm-4q", Profile: "T4-4Q", Workload: "rendering", Source: "sched", Tune: &TuneRequest{Scheduler: "fixed_share"}},
			"attach T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule request]; tune scheduler=equal_share timeslice_us=2000 clocks_mhz=0 gpus=0000:81:00.0 [rule render-share]", "", "the operator's rules win"},
		{"tune request without a vGPU", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "T4-4Q", Source: "sched", Tune: &TuneRequest{ClocksMHz: 1200}},
			"attach T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule request]", "", "no GPU to tune"},
		{"tune request equal to operator setting", Event{Kind: KindGPURequest, InstanceUUID: "vm-4q", Profile: "T4-4Q", Source: "sched", Tune: &TuneRequest{Scheduler: "best_effort"}},
			"attach T4-4Q x1 mode=nova-resize trait=CUSTOM_NVIDIA_232 [rule request]", "", ""},
		{"notify on resolved alert", Event{Kind: KindAlert, InstanceUUID: "vm-4q", Status: "resolved", Metrics: map[string]float64{"gpu_util": 50}},
			`notify "alert resolved for vm-4q" [rule tell]`, "", ""},
		{"no rule for kind", Event{Kind: "nova.instance.reboot.end", InstanceUUID: "vm-4q"}, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Evaluate(tt.ev, st, nil)
			if got := kinds(d); got != tt.want {
				t.Errorf("intents:\n got %s\nwant %s\n%s", got, tt.want, d.Explain())
			}
			if tt.rejected == "" && d.Rejected {
				t.Errorf("rejected: %s\n%s", d.Reason, d.Explain())
			}
			if tt.rejected != "" && (!d.Rejected || !strings.HasPrefix(d.Reason, tt.rejected)) {
				t.Errorf("rejected=%v reason %q, want %q", d.Rejected, d.Reason, tt.rejected)
			}
			if tt.wantRefuse != "" {
				found := false
				for _, r := range d.Refused {
					found = found || strings.Contains(r.Reason, tt.wantRefuse)
				}
				if !found {
					t.Errorf("no refusal containing %q:\n%s", tt.wantRefuse, d.Explain())
				}
			}
		})
	}
}

func TestQuota(t *testing.T) {
	p := testPolicy(t)
	st := fleet()
	st.Instances = append(st.Instances,
		Instance{UUID: "vm-full", ProjectID: "full", Host: "cmp1"},
		Instance{UUID: "vm-two", ProjectID: "p1", Host: "cmp1", VGPUs: []VGPU{{Profile: "T4-2Q", Count: 2}}},
		Instance{UUID: "vm-q", ProjectID: "qonly", Host: "cmp1"},
		Instance{UUID: "vm-small2", ProjectID: "small", Host: "cmp1"},
	)
	tests := []struct {
		name   string
		ev     Event
		want   string // attached profile and count, or "" when refused
		reason string
	}{
		{"exactly at vGPU quota", Event{Kind: KindGPURequest, InstanceUUID: "vm-small", Profile: "T4-2Q", ProjectID: "small"}, "T4-2Q x1", ""},
		{"over vGPU quota by one", Event{Kind: KindGPURequest, InstanceUUID: "vm-small2", Profile: "T4-1Q", Count: 2}, "", "project small would hold 3 vGPUs; its quota is 2"},
		{"framebuffer exactly at quota", Event{Kind: KindGPURequest, InstanceUUID: "vm-small", Profile: "T4-4Q"}, "T4-4Q x1", ""},
		{"framebuffer over quota", Event{Kind: KindGPURequest, InstanceUUID: "vm-small", Profile: "T4-8Q"}, "", "project small would hold 12 GiB of vGPU framebuffer; its quota is 8 GiB"},
		{"series not allowed", Event{Kind: KindGPURequest, InstanceUUID: "vm-small", Profile: "T4-4C"}, "", "series C of T4-4C is not allowed for project small"},
		{"preference skips disallowed series", Event{Kind: KindGPURequest, InstanceUUID: "vm-small", Workload: "training"}, "", "no vGPU profile fits"},
		{"profile not allowed", Event{Kind: KindGPURequest, InstanceUUID: "vm-q", Profile: "T4-8Q"}, "", "profile T4-8Q is not allowed for project qonly (allowed: T4-2Q, T4-4Q)"},
		{"allowed profile", Event{Kind: KindGPURequest, InstanceUUID: "vm-q", Profile: "T4-4Q"}, "T4-4Q x1", ""},
		{"per-VM limit", Event{Kind: KindGPURequest, InstanceUUID: "vm-two", Profile: "T4-2Q"}, "", "the instance would hold 3 vGPUs; project p1 allows 2 per VM"},
		{"project full", Event{Kind: KindGPURequest, InstanceUUID: "vm-full", Profile: "T4-1Q"}, "", "project full would hold 9 vGPUs; its quota is 8"},
		{"largest that fits the framebuffer quota", Event{Kind: KindGPURequest, InstanceUUID: "vm-full", Workload: "training", Count: 1}, "", "no vGPU profile fits"},
		{"resize grows framebuffer over quota", Event{Kind: KindGPUResize, InstanceUUID: "vm-small", Profile: "T4-16Q"}, "", "project small would hold 16 GiB of vGPU framebuffer; its quota is 8 GiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Evaluate(tt.ev, st, nil)
			got := ""
			for _, in := range d.Intents {
				if in.Kind == IntentAttach {
					got = in.Profile + " x" + itoa(in.Count)
				}
			}
			if got != tt.want {
				t.Errorf("attached %q, want %q\n%s", got, tt.want, d.Explain())
			}
			if tt.reason != "" && (!d.Rejected || d.Reason != tt.reason) {
				t.Errorf("reason = %q (rejected %v), want %q\n%s", d.Reason, d.Rejected, tt.reason, d.Explain())
			}
		})
	}
}

func itoa(n int) string { return strings.TrimSpace(strings.Repeat(" ", 0) + string(rune('0'+n))) }

func TestHysteresis(t *testing.T) {
	p := testPolicy(t)
	st := fleet()
	tr := NewTracker()
	load := func(at time.Duration, util float64) *Decision {
		d := p.Evaluate(Event{Kind: KindGPULoad, InstanceUUID: "vm-4q", Time: t0.Add(at), Metrics: map[string]float64{"gpu_util": util}}, st, tr)
		tr.Apply(d.LoadUpdates)
		return d
	}
	outcome := func(d *Decision, rule string) Outcome {
		for _, r := range d.Rules {
			if r.Rule == rule {
				return r.Outcome
			}
		}
		return ""
	}
	steps := []struct {
		at   time.Duration
		util float64
		up   Outcome
		down Outcome
		want string
	}{
		{0, 95, OutcomeHolding, OutcomeFalse, ""},
		{2 * time.Minute, 97, OutcomeHolding, OutcomeFalse, ""},
		{3 * time.Minute, 50, OutcomeFalse, OutcomeFalse, ""}, // dip: window restarts
		{4 * time.Minute, 95, OutcomeHolding, OutcomeFalse, ""},
		{8 * time.Minute, 95, OutcomeHolding, OutcomeFalse, ""},
		{9 * time.Minute, 95, OutcomeFired, OutcomeFalse, "resize to T4-8Q"},
		// The bridge acted; within the cooldown nothing changes again.
		{15 * time.Minute, 99, OutcomeHolding, OutcomeFalse, ""},
		{20 * time.Minute, 99, OutcomeCooldown, OutcomeFalse, ""},
		{23*time.Minute + 59*time.Second, 99, OutcomeCooldown, OutcomeFalse, ""},
		{24 * time.Minute, 99, OutcomeFired, OutcomeFalse, "resize to T4-8Q"}, // 15m after the change at 9m
		// Idle: down needs 30 minutes.
		{30 * time.Minute, 10, OutcomeFalse, OutcomeHolding, ""},
		{59 * time.Minute, 10, OutcomeFalse, OutcomeHolding, ""},
		{60 * time.Minute, 10, OutcomeFalse, OutcomeFired, "resize to T4-2Q"},
	}
	for i, s := range steps {
		d := load(s.at, s.util)
		if got := outcome(d, "up"); got != s.up {
			t.Errorf("step %d (t+%s util %g): up = %s, want %s\n%s", i, s.at, s.util, got, s.up, d.Explain())
		}
		if got := outcome(d, "down"); got != s.down {
			t.Errorf("step %d (t+%s util %g): down = %s, want %s\n%s", i, s.at, s.util, got, s.down, d.Explain())
		}
		got := ""
		for _, in := range d.Intents {
			got = string(in.Kind) + " to " + in.Profile
		}
		if got != s.want {
			t.Errorf("step %d: intents %q, want %q", i, got, s.want)
		}
	}
}

// TestHeldIsDeferred: an alert attaches, and its resolution comes inside
// the release rule's cooldown. The decision drops nothing: it lists the
// rule as held until the cooldown's end, and evaluating the event again
// then (EvaluateHeld, only the held rules) releases the vGPU; before the
// end it is held again. A for: window is a hold the same way.
func TestHeldIsDeferred(t *testing.T) {
	p, err := Load(strings.NewReader(`rules:
  - name: resolved-alert-releases
    on: [alert]
    when: event.status == "resolved" && instance.vgpu_count > 0
    cooldown: 20s
    then: ['release()']
  - name: note-resolved
    on: [alert]
    when: event.status == "resolved"
    then: ['notify("resolved")']
  - name: hot-for-a-while
    on: [alert]
    when: event.status == "firing"
    for: 1m
    then: ['notify("hot for a minute")']
`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := fleet()
	tr := NewTracker()
	tr.Apply([]LoadUpdate{{Op: LoadChange, Instance: "vm-4q", At: t0}}) // the alert's attach
	resolved := Event{Kind: KindAlert, Status: "resolved", InstanceUUID: "vm-4q", Time: t0.Add(3 * time.Second)}

	d := p.Evaluate(resolved, st, tr)
	rules, until := d.HeldRules()
	if d.Rejected || len(rules) != 1 || rules[0] != "resolved-alert-releases" || !until.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("held %v until %s (rejected %v), want the release rule until the cooldown's end\n%s", rules, until, d.Rejected, d.Explain())
	}
	if strings.Contains(kinds(d), "release") {
		t.Fatalf("released inside the cooldown: %s", kinds(d))
	}

	// Too early (a replica's clock): held again, nothing else runs twice.
	early := resolved
	early.Time = t0.Add(10 * time.Second)
	d = p.EvaluateHeld(early, st, tr, rules)
	if r, u := d.HeldRules(); len(r) != 1 || !u.Equal(until) || len(d.Intents) != 0 {
		t.Fatalf("early re-evaluation: held %v until %s, intents %s\n%s", r, u, kinds(d), d.Explain())
	}

	// At the cooldown's end: the release, and only the held rule ran (the
	// notify fired with the first evaluation).
	again := resolved
	again.Time = until
	d = p.EvaluateHeld(again, st, tr, rules)
	if got := kinds(d); got != "release T4-4Q x1 mode=nova-resize [rule resolved-alert-releases]" || len(d.Held) != 0 {
		t.Fatalf("re-evaluation at the cooldown's end: %q held %v\n%s", got, d.Held, d.Explain())
	}
	for _, r := range d.Rules {
		if r.Rule == "note-resolved" && r.Outcome != OutcomeSkipped {
			t.Errorf("a rule that was not held ran again: %+v", r)
		}
	}

	// A for: window: held until it would have held long enough.
	firing := Event{Kind: KindAlert, Status: "firing", InstanceUUID: "vm-none", Time: t0}
	d = p.Evaluate(firing, st, tr)
	tr.Apply(d.LoadUpdates)
	if r, u := d.HeldRules(); len(r) != 1 || r[0] != "hot-for-a-while" || !u.Equal(t0.Add(time.Minute)) {
		t.Fatalf("for: held %v until %s\n%s", r, u, d.Explain())
	}
	firing.Time = t0.Add(time.Minute)
	d = p.EvaluateHeld(firing, st, tr, []string{"hot-for-a-while"})
	if got := kinds(d); !strings.Contains(got, "hot for a minute") || len(d.Held) != 0 {
		t.Fatalf("for: re-evaluated at the window's end: %q\n%s", got, d.Explain())
	}
}

func TestLoadRuleNeedsInstance(t *testing.T) {
	p := testPolicy(t)
	d := p.Evaluate(Event{Kind: KindGPULoad, Metrics: map[string]float64{"gpu_util": 99}}, nil, NewTracker())
	if d.Rules[0].Outcome != OutcomeError || len(d.Intents) != 0 {
		t.Errorf("got\n%s", d.Explain())
	}
}

func TestMissingMetricIsExplained(t *testing.T) {
	p, err := Load(strings.NewReader(`rules:
  - name: hot
    on: [alert]
    when: metrics.temp > 80.0
    then: ['notify("hot")']
`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := p.Evaluate(Event{Kind: KindAlert, Time: t0}, nil, nil)
	r := d.Rules[0]
	if r.Outcome != OutcomeError || !strings.Contains(r.Detail, "no such key") || r.Values[0] != (Value{"metrics.temp", "<absent>"}) {
		t.Errorf("trace = %+v", r)
	}
}

func TestCompat(t *testing.T) {
	c := testCompat(t)
	tests := []struct {
		hyp, host, guest string
		ok               bool
		reason           string
	}{
		{"VMware ESXi 7.0 U3", "450.156", "450.156", true, "known-good"},
		{"KVM (QEMU 6)", "470.82.01", "470.82.01", true, "known-good"},
		{"Xen 4.14", "460.91.03", "460.91.03", true, "known-good"},
		{"KVM", "470.82.01", "470.57.02", true, "from host branch 470"},
		{"KVM", "470.82.01", "510.47.03", false, "guest driver 510.47.03 is newer than host branch 470; the guest would show code 43"},
		{"KVM", "470.82.01", "460.91.03", false, "guest driver 460.91.03 is not supported by host branch 470; the guest would show code 43"},
		{"KVM", "535.104.06", "525.125.06", true, "the one before host branch 535"},
		{"KVM", "535.104.06", "510.47.03", false, "not supported by host branch 535"},
		{"KVM", "550.54.10", "535.161.07", true, "the one before host branch 550"},
		{"KVM", "", "535.1", true, "no driver versions"},
		{"KVM", "garbage", "535.1", false, "cannot compare"},
	}
	for _, tt := range tests {
		v := c.Check(tt.hyp, tt.host, tt.guest)
		if v.Supported != tt.ok || !strings.Contains(v.Reason, tt.reason) {
			t.Errorf("Check(%q, %q, %q) = %+v, want %v %q", tt.hyp, tt.host, tt.guest, v, tt.ok, tt.reason)
		}
	}
	exc, err := LoadCompat(strings.NewReader(`branches: [525, 535]
rule: {same_branch: true, previous_branch: true, previous_branch_since: 535}
exceptions:
  - {host: "535.104.06", guest: "525", supported: false, reason: "known hang"}
  - {hypervisor: Xen, host: "*", guest: "*", supported: false, reason: "no Xen here"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if v := exc.Check("KVM", "535.104.06", "525.1"); v.Supported || !strings.Contains(v.Reason, "known hang (driver-compat line 4)") {
		t.Errorf("exception: %+v", v)
	}
	if v := exc.Check("KVM", "535.129.03", "525.1"); !v.Supported {
		t.Errorf("rule: %+v", v)
	}
	if v := exc.Check("xen 4.14", "535.129.03", "535.1"); v.Supported {
		t.Errorf("hypervisor exception: %+v", v)
	}
}

func TestCompatLoadErrors(t *testing.T) {
	tests := []struct{ doc, want string }{
		{"branches: [470, 460]\n", "1:17: branches must be listed oldest first"},
		{"matrix:\n  - {host: 4x0, guest: 470}\n", "2:12: host version \"4x0\""},
		{"matrix:\n  - {host: \"470\"}\n", "2:5: matrix row needs both host and guest"},
		{"rule: {previous_branch: true}\n", "1:1: rule.previous_branch needs the branches list"},
		{"colour: red\n", "1:1: driver compatibility: unknown key \"colour\""},
	}
	for _, tt := range tests {
		_, err := LoadCompat(strings.NewReader(tt.doc))
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("LoadCompat(%q) = %v, want %q", tt.doc, err, tt.want)
		}
	}
}

func TestDriverCompatInDecisions(t *testing.T) {
	p := testPolicy(t)
	st := fleet()
	// nova-resize: cmp1 (470) cannot serve a 535 guest; cmp2 can.
	d := p.Evaluate(Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "T4-4Q", GuestDriver: "535.104.05"}, st, nil)
	if len(d.Intents) != 1 || len(d.Intents[0].ExcludedHosts) != 1 || d.Intents[0].ExcludedHosts[0].Host != "cmp1" ||
		d.Intents[0].ExcludedHosts[0].Reason != "guest driver 535.104.05 is newer than host branch 470; the guest would show code 43" {
		t.Errorf("nova-resize:\n%s", d.Explain())
	}
	// direct-live on cmp1: refused with the reason.
	d = p.Evaluate(Event{Kind: KindGPURequest, InstanceUUID: "vm-live", Profile: "T4-4Q", GuestDriver: "535.104.05"}, st, nil)
	if !d.Rejected || d.Reason != "host cmp1: guest driver 535.104.05 is newer than host branch 470; the guest would show code 43" {
		t.Errorf("direct-live:\n%s", d.Explain())
	}
	// No host can: refused.
	d = p.Evaluate(Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "T4-4Q", GuestDriver: "580.1"}, st, nil)
	if !d.Rejected || !strings.HasPrefix(d.Reason, "no host's vGPU manager supports guest driver 580.1") {
		t.Errorf("none:\n%s", d.Explain())
	}
	// The image's driver, through the instance.
	st.Instances[0].GuestDriver = "470.82.01"
	d = p.Evaluate(Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "T4-4Q"}, st, nil)
	if len(d.Intents) != 1 || len(d.Intents[0].ExcludedHosts) != 1 || d.Intents[0].ExcludedHosts[0].Host != "cmp2" {
		t.Errorf("instance driver:\n%s", d.Explain())
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"cel type error", `rules:
  - name: bad-type
    on: [alert]
    when: metrics.gpu_util > "high"
    then: ['notify("x")']
`, []string{`4:28: rule "bad-type": when: found no matching overload for '_>_' applied to '(double, string)'`}},
		{"unknown field", `rules:
  - name: typo
    on: [alert]
    when: 'event.workloda == "x"'
    then: ['notify("x")']
`, []string{`4:17: rule "typo": when: undefined field 'workloda'`}},
		{"then not an intent", `rules:
  - name: not-intent
    on: [alert]
    then: ['"attach"']
`, []string{`4:13: rule "not-intent": then: expression has type string, want policy.Intent`}},
		{"when not bool", `rules:
  - name: nb
    on: [alert]
    when: event.count
    then: [release()]
`, []string{`4:11: rule "nb": when: expression has type int, want bool`}},
		{"syntax error in block scalar", "rules:\n  - name: blk\n    on: [alert]\n    when: |\n      event.count >\n    then: [release()]\n", []string{`6:5: rule "blk": when: Syntax error`}},
		{"wrong arity", `rules:
  - name: arity
    on: [alert]
    then: ['attach(1, 2, 3)']
`, []string{`4:19: rule "arity": then: found no matching overload for 'attach'`}},
		{"missing parts", "rules:\n  - name: empty\n", []string{`2:5: rule "empty": needs "on"`, `2:5: rule "empty": needs "then"`}},
		{"duplicate rule", "rules:\n  - {name: a, on: [alert], then: [release()]}\n  - {name: a, on: [alert], then: [release()]}\n", []string{`3:5: rule "a" already defined at 2:5`}},
		{"unknown profile", "profiles:\n  T4-3Q: {attach_mode: direct-live}\n", []string{`2:3: profile T4-3Q is not in the profile catalog`}},
		{"bad mode", "defaults:\n  attach_mode: teleport\n", []string{`2:16: attach_mode "teleport"`}},
		{"bad series", "workloads:\n  training: {series: [Z]}\n", []string{`2:23: series "Z"`}},
		{"bad quota", "defaults:\n  quota: {max_vgpus: -1}\n", []string{`2:22: max_vgpus "-1"`}},
		{"unknown key", "rulez: []\n", []string{`1:1: policy: unknown key "rulez"`}},
		{"bad duration", "rules:\n  - {name: a, on: [alert], for: soon, then: [release()]}\n", []string{`2:33: for "soon"`}},
		{"bad kind", "rules:\n  - {name: a, on: ['a*b'], then: [release()]}\n", []string{`2:20: event kind "a*b"`}},
		{"yaml syntax", "rules: [\n", []string{`YAML syntax`}},
		{"version", "version: 2\n", []string{`1:10: version "2": want an integer from 1 to 1`}},
	}
	cat := testCatalog(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(strings.NewReader(tt.doc), Options{Catalog: cat})
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error = %v, want *LoadError", err)
			}
			if len(le.Errors) != len(tt.want) {
				t.Fatalf("got %d errors:\n%v\nwant %d", len(le.Errors), err, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(le.Errors[i].Error(), w) {
					t.Errorf("error %d = %q, want it to contain %q", i, le.Errors[i].Error(), w)
				}
			}
		})
	}
}

func TestSampleFilesLoad(t *testing.T) {
	for _, name := range []string{"rules.yaml", "driver-compat.yaml", "profiles.yaml"} {
		a, err := os.ReadFile(filepath.Join("..", "etc", "vgpu-bridge", name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if string(a) != string(b) {
			t.Errorf("testdata/%s differs from etc/vgpu-bridge/%s; copy it again", name, name)
		}
	}
	if _, err := Build(Config{RulesFile: "testdata/rules.yaml", ProfilesFile: "testdata/profiles.yaml", CompatFile: "testdata/driver-compat.yaml"}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestDeterministic(t *testing.T) {
	p := testPolicy(t)
	ev := Event{Kind: KindGPURequest, InstanceUUID: "vm-4q", Profile: "T4-4Q", Workload: "rendering", Source: "farm", GuestDriver: "470.82.01", Time: t0}
	first := p.Evaluate(ev, fleet(), nil).Explain()
	for i := 0; i < 20; i++ {
		if got := p.Evaluate(ev, fleet(), nil).Explain(); got != first {
			t.Fatalf("evaluation %d differs:\n%s\nvs\n%s", i, got, first)
		}
	}
}

func TestGoldenExplanations(t *testing.T) {
	p := testPolicy(t)
	tr := NewTracker()
	tr.Apply([]LoadUpdate{{Op: LoadArm, Instance: "vm-4q", Rule: "up", At: t0.Add(-6 * time.Minute)}})
	cases := []struct {
		name string
		ev   Event
		ls   LoadState
	}{
		{"request-training", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "training", Time: t0}, nil},
		{"request-over-quota", Event{Kind: KindGPURequest, InstanceUUID: "vm-small", Profile: "T4-8Q", Time: t0}, nil},
		{"request-guest-driver", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "vdi", GuestDriver: "535.104.05", Time: t0}, nil},
		{"load-fires", Event{Kind: KindGPULoad, InstanceUUID: "vm-4q", Metrics: map[string]float64{"gpu_util": 96.5}, Time: t0}, tr},
		{"load-holding", Event{Kind: KindGPULoad, InstanceUUID: "vm-4q", Metrics: map[string]float64{"gpu_util": 96.5}, Time: t0}, NewTracker()},
		{"tune-request", Event{Kind: KindGPURequest, InstanceUUID: "vm-4q", Profile: "T4-4Q", Source: "sched", Tune: &TuneRequest{Scheduler: "fixed_share", TimesliceUS: 500}, Time: t0}, nil},
		{"banned", Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Workload: "vdi", Labels: map[string]string{"banned": "yes"}, Time: t0}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := p.Evaluate(c.ev, fleet(), c.ls).Explain()
			path := filepath.Join("testdata", "explain", c.name+".golden")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestGoldenExplanations -update)", err)
			}
			if got != string(want) {
				t.Errorf("explanation differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

func FuzzLoad(f *testing.F) {
	for _, name := range []string{"testdata/rules.yaml", "testdata/test-policy.yaml"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("rules:\n  - {name: a, on: [alert], when: 'metrics.x > 1.0', then: [release()]}\n")
	f.Add("defaults: {quota: {max_vgpus: 1}}\n")
	f.Add("rules: [{name: x, on: [a], when: '(((', then: ['attach(\"\", 1)']}]")
	cat, err := catalog.LoadFile("testdata/profiles.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		p, err := Load(strings.NewReader(doc), Options{Catalog: cat, Clock: func() time.Time { return t0 }})
		if err != nil {
			var le *LoadError
			if errors.As(err, &le) && len(le.Errors) == 0 {
				t.Fatal("LoadError without errors")
			}
			return
		}
		// A policy that loads must evaluate without panicking.
		for _, k := range []string{KindGPURequest, KindGPULoad, KindAlert} {
			p.Evaluate(Event{Kind: k, InstanceUUID: "vm-4q", Workload: "training", Metrics: map[string]float64{"gpu_util": 95}}, fleet(), NewTracker())
		}
	})
}

func FuzzLoadCompat(f *testing.F) {
	b, err := os.ReadFile("testdata/driver-compat.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Add("matrix: [{host: '1', guest: '1.*'}]")
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := LoadCompat(strings.NewReader(doc))
		if err != nil {
			return
		}
		c.Check("KVM", "470.82.01", "535.1")
	})
}

func TestCompatSupportedAgreesWithCheck(t *testing.T) {
	c := testCompat(t)
	vs := []string{"", "450.156", "460.91.03", "470.82.01", "470.57.02", "510.47.03", "525.125.06", "535.104.06", "550.54.10", "570.1", "x"}
	for _, hyp := range []string{"KVM", "VMware ESXi 7.0 U3", "Xen 4.14"} {
		for _, h := range vs {
			for _, g := range vs {
				if got, want := c.Supported(hyp, h, g), c.Check(hyp, h, g).Supported; got != want {
					t.Errorf("Supported(%q, %q, %q) = %v, Check says %v", hyp, h, g, got, want)
				}
			}
		}
	}
}

func TestNestedFieldsInRules(t *testing.T) {
	p, err := Load(strings.NewReader(`rules:
  - name: has-4q
    on: [alert]
    when: instance.vgpus.exists(v, v.profile == "T4-4Q" && v.count == 1) && host.gpus[0].model == "T4"
    then: ['notify("4q on " + host.name)']
  - name: tune-asked
    on: [alert]
    when: event.tune.scheduler == "fixed_share"
    then: ['notify("tune")']
  - name: time
    on: [alert]
    when: event.time <= now && metrics["gpu_util"] >= 0.0 && series(instance.profile) == "Q" && framebuffer_mib(instance.profile) == 4096
    then: ['notify("ok")']
`), Options{Catalog: testCatalog(t), Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	d := p.Evaluate(Event{Kind: KindAlert, InstanceUUID: "vm-4q", Time: t0.Add(-time.Minute), Metrics: map[string]float64{"gpu_util": 1}}, fleet(), nil)
	want := []Outcome{OutcomeFired, OutcomeFalse, OutcomeFired}
	for i, r := range d.Rules {
		if r.Outcome != want[i] {
			t.Errorf("rule %s: %s (%s), want %s", r.Rule, r.Outcome, r.Detail, want[i])
		}
	}
	if got := d.Rules[2].Values; len(got) != 3 || got[0] != (Value{"event.time", "2025-03-01T11:59:00Z"}) || got[2] != (Value{`metrics["gpu_util"]`, "1"}) {
		t.Errorf("values = %+v", got)
	}
	d = p.Evaluate(Event{Kind: KindAlert, InstanceUUID: "vm-4q", Tune: &TuneRequest{Scheduler: "fixed_share"}}, fleet(), nil)
	if d.Rules[1].Outcome != OutcomeFired {
		t.Errorf("tune-asked: %+v", d.Rules[1])
	}
}

// limitState is a MemState with unified limits (policy.LimitState).
type limitState struct {
	*MemState
	limits map[string][]UnifiedLimit
}

func (s limitState) ProjectLimits(id string) []UnifiedLimit { return s.limits[id] }

// TestUnifiedLimits: Keystone's unified limits refuse what would take the
// project over them (usage + request > limit, as oslo_limit enforces),
// with code quota and a reason naming the limit, the usage and the
// request; class:VGPU counts every vGPU an attach adds and none a resize
// adds; vgpu:<profile> counts its profile only, a resize moving the
// instance's vGPUs into the target profile.
func TestUnifiedLimits(t *testing.T) {
	p := testPolicy(t)
	vgpu := func(limit, usage int) UnifiedLimit {
		return UnifiedLimit{Resource: "class:VGPU", Limit: limit, Usage: usage}
	}
	prof := func(name string, limit, usage int) UnifiedLimit {
		return UnifiedLimit{Resource: "vgpu:" + name, Profile: name, Limit: limit, Usage: usage}
	}
	attach := Event{Kind: KindGPURequest, InstanceUUID: "vm-none", Profile: "T4-2Q"}
	resize := Event{Kind: KindGPUResize, InstanceUUID: "vm-4q", Profile: "T4-2Q"}
	for _, tc := range []struct {
		name   string
		ev     Event
		limits []UnifiedLimit
		reason string // "" when the change passes
	}{
		{"attach under class:VGPU", attach, []UnifiedLimit{vgpu(2, 1)}, ""},
		{"attach over class:VGPU", attach, []UnifiedLimit{vgpu(1, 1)},
			"project p1 would exceed its Keystone unified limit class:VGPU: limit 1, usage 1, request 1"},
		{"class:VGPU 0: nothing allowed", attach, []UnifiedLimit{vgpu(0, 0)},
			"project p1 would exceed its Keystone unified limit class:VGPU: limit 0, usage 0, request 1"},
		{"another profile's limit", attach, []UnifiedLimit{vgpu(4, 1), prof("T4-4Q", 1, 1)}, ""},
		{"its profile's limit", attach, []UnifiedLimit{vgpu(4, 1), prof("T4-2Q", 1, 1)},
			"project p1 would exceed its Keystone unified limit vgpu:T4-2Q: limit 1, usage 1, request 1"},
		{"resize adds no class:VGPU", resize, []UnifiedLimit{vgpu(1, 1)}, ""},
		{"resize into a full profile", resize, []UnifiedLimit{vgpu(1, 1), prof("T4-2Q", 2, 2)},
			"project p1 would exceed its Keystone unified limit vgpu:T4-2Q: limit 2, usage 2, request 1"},
		{"resize into a profile with room", resize, []UnifiedLimit{vgpu(1, 1), prof("T4-2Q", 2, 1)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := limitState{MemState: fleet(), limits: map[string][]UnifiedLimit{"p1": tc.limits}}
			d := p.Evaluate(tc.ev, st, nil)
			changed := false
			for _, in := range d.Intents {
				changed = changed || in.Kind == IntentAttach || in.Kind == IntentResize
			}
			if tc.reason == "" {
				if !changed {
					t.Errorf("refused, want it to pass\n%s", d.Explain())
				}
				return
			}
			found := false
			for _, r := range d.Refused {
				found = found || r.Code == RefusalQuota && strings.Contains(r.Reason, tc.reason)
			}
			if changed || !found {
				t.Errorf("intents %v, refused %+v; want refused with code quota: %q\n%s", d.Intents, d.Refused, tc.reason, d.Explain())
			}
		})
	}
	// Without LimitState the same attach passes.
	if d := p.Evaluate(attach, fleet(), nil); len(d.Refused) > 0 {
		t.Errorf("without unified limits: refused %+v", d.Refused)
	}
}

// gpuFaultRules are the example of doc/source/operations.rst: move a
// direct-path vGPU off a faulted GPU, tell the tenant of a Nova-path one.
const gpuFaultRules = `rules:
  - name: gpu-fault-move
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "direct")
    then: ['move()']
  - name: gpu-fault-tell
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "nova")
    then: ['notify("the GPU of your vGPU failed (" + event.labels.reason + "); migrate the VM to get a healthy one")']
`

// TestMoveOnGPUFault: move() leaves the GPU the event names, with the
// instance's host; the rules tell a direct-path vGPU from a flavor's by
// its path; an event that names no GPU refuses the move.
func TestMoveOnGPUFault(t *testing.T) {
	p, err := Load(strings.NewReader(gpuFaultRules+`  - name: move-on-alert
    on: [alert]
    then: ['move()']
`), Options{Catalog: testCatalog(t), Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	const sick = "0000:81:00.0"
	st := fleet()
	st.Instances = append(st.Instances,
		Instance{UUID: "vm-direct", ProjectID: "p1", Host: "cmp1", State: "active", VGPUs: []VGPU{{Profile: "T4-4Q", Count: 1, GPU: sick, Path: VGPUPathDirect}}},
		Instance{UUID: "vm-other-gpu", ProjectID: "p1", Host: "cmp1", State: "active", VGPUs: []VGPU{{Profile: "T4-4Q", Count: 1, GPU: "0000:82:00.0", Path: VGPUPathDirect}}},
		Instance{UUID: "vm-nova", ProjectID: "p1", Host: "cmp1", State: "active", VGPUs: []VGPU{{Count: 1, GPU: sick, Path: VGPUPathNova}}})
	fault := func(vm string) Event {
		return Event{Kind: KindGPUFault, Source: "bridge", InstanceUUID: vm, Labels: map[string]string{"gpu": sick, "provider_uuid": "rp-a", "host": "cmp1",
			"fault_source": "xid", "xid": "79", "reason": "Xid 79: GPU has fallen off the bus"}}
	}
	for _, tt := range []struct{ vm, want string }{
		{"vm-direct", "move off " + sick + " mode=direct-live [rule gpu-fault-move]"},
		{"vm-other-gpu", ""},
		{"vm-nova", `notify "the GPU of your vGPU failed (Xid 79: GPU has fallen off the bus); migrate the VM to get a healthy one" [rule gpu-fault-tell]`},
	} {
		d := p.Evaluate(fault(tt.vm), st, nil)
		if got := kinds(d); got != tt.want || len(d.Refused) > 0 {
			t.Errorf("%s: intents %q (refused %+v), want %q", tt.vm, got, d.Refused, tt.want)
		}
		if tt.vm == "vm-direct" && (d.Intents[0].Host != "cmp1" || d.Intents[0].Instance != "vm-direct") {
			t.Errorf("move intent %+v, want the instance and its host", d.Intents[0])
		}
	}
	d := p.Evaluate(Event{Kind: KindAlert, InstanceUUID: "vm-direct"}, st, nil)
	if len(d.Intents) != 0 || len(d.Refused) != 1 || !strings.Contains(d.Refused[0].Reason, "names none (label gpu") {
		t.Errorf("move() on an event naming no GPU: intents %q, refused %+v", kinds(d), d.Refused)
	}
}
