package pipeline

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

const inst = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c04"

func known(host string) InstanceFacts {
	return InstanceFacts{UUID: inst, ProjectID: "p", UserID: "u", Host: host, Node: host, VMState: "active", Known: true}
}

func attach(mode policy.AttachMode) policy.Intent {
	return policy.Intent{Kind: policy.IntentAttach, Instance: inst, Profile: "T4-4Q", TypeID: "nvidia-232", Trait: "CUSTOM_NVIDIA_232", Count: 1, Mode: mode}
}

func att(state, profile string) flow.Attachment {
	return flow.Attachment{ID: uuid.New(), InstanceUUID: inst, Host: "cmp1", Provider: "rp", Class: "VGPU", Amount: 1, PCIAddress: "0000:3b:00.0",
		TypeID: "nvidia-232", Profile: profile, Mode: protocol.ModeLive, State: state}
}

func withFlavorVGPUs(in InstanceFacts, n int) InstanceFacts {
	in.FlavorVGPUs = n
	return in
}

func resize(mode policy.AttachMode) policy.Intent {
	return policy.Intent{Kind: policy.IntentResize, Instance: inst, Profile: "T4-2Q", TypeID: "nvidia-231", Trait: "CUSTOM_NVIDIA_231", Count: 1, Mode: mode}
}

func TestPlanDecision(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		d       policy.Decision
		f       Facts
		outcome flow.Outcome
		code    string
		steps   []flow.StepKind
		mode    string
		inWhy   string
	}{
		{name: "rejected by policy", d: policy.Decision{Rejected: true, Reason: "instance is deleted"}, f: Facts{Instance: known("cmp1")},
			outcome: flow.OutcomeReject, code: flow.CodePolicyRejected, inWhy: "deleted"},
		{name: "rejected by the quota", d: policy.Decision{Rejected: true, Reason: "project p would hold 5 vGPUs", Code: policy.RefusalQuota},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeReject, code: flow.CodeQuota, inWhy: "would hold"},
		{name: "direct resize: release, then attach", d: policy.Decision{Intents: []policy.Intent{resize(policy.ModeDirectLive)}},
			f:       Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{att(flow.AttAttached, "T4-4Q")}},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepRelease, flow.StepAttach}},
		{name: "direct resize while a change is in flight", d: policy.Decision{Intents: []policy.Intent{resize(policy.ModeDirectLive)}},
			f:       Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{att(flow.AttAttached, "T4-4Q"), att(flow.AttPending, "T4-4Q")}},
			outcome: flow.OutcomeFail, code: flow.CodeBusy},
		{name: "direct resize with no vGPU", d: policy.Decision{Intents: []policy.Intent{resize(policy.ModeDirectLive)}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeReject, code: flow.CodeRefused, inWhy: "holds no vGPU to change"},
		{name: "a flavor's vGPU changes through Nova whatever the mode", d: policy.Decision{Intents: []policy.Intent{resize(policy.ModeDirectLive)}},
			f: Facts{Instance: withFlavorVGPUs(known("cmp1"), 1)}, outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepNovaResize}},
		{name: "a direct vGPU changes on the direct path whatever the mode", d: policy.Decision{Intents: []policy.Intent{resize(policy.ModeNovaResize)}},
			f:       Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{att(flow.AttAttached, "T4-4Q")}},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepRelease, flow.StepAttach}},
		{name: "nova resize of an instance without vGPU", d: policy.Decision{Intents: []policy.Intent{resize(policy.ModeNovaResize)}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepNovaResize}},
		{name: "nova resize of an unknown instance", d: policy.Decision{Intents: []policy.Intent{resize(policy.ModeNovaResize)}},
			f: Facts{Instance: InstanceFacts{UUID: inst}}, outcome: flow.OutcomeFail, code: flow.CodeNoInstance},
		{name: "direct live attach", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeDirectLive)}}, f: Facts{Instance: known("cmp1")},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepAttach}, mode: protocol.ModeLive},
		{name: "live attach to a stopped server changes its definition", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeDirectLive)}},
			f: Facts{Instance: InstanceFacts{UUID: inst, Host: "cmp1", VMState: "stopped", Known: true}}, outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepAttach}, mode: protocol.ModeConfig},
		{name: "cold attach", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeDirectCold)}}, f: Facts{Instance: known("cmp1")},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepAttach}, mode: protocol.ModeCold},
		{name: "nova path resizes", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeNovaResize)}}, f: Facts{Instance: known("cmp1")},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepNovaResize}},
		{name: "nova path on a stale host: Nova chooses the host", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeNovaResize)}},
			f:       Facts{Instance: known("cmp1"), LastReport: now.Add(-10 * time.Minute), Now: now, StaleAge: 5 * time.Minute},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepNovaResize}},
		{name: "nova path, no host", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeNovaResize)}}, f: Facts{Instance: known("")},
			outcome: flow.OutcomeFail, code: flow.CodeNoHost},
		{name: "unknown instance", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeDirectLive)}}, f: Facts{Instance: InstanceFacts{UUID: inst}},
			outcome: flow.OutcomeFail, code: flow.CodeNoInstance, inWhy: "not known"},
		{name: "no host", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeDirectLive)}}, f: Facts{Instance: known("")},
			outcome: flow.OutcomeFail, code: flow.CodeNoHost},
		{name: "stale host", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeDirectLive)}},
			f:       Facts{Instance: known("cmp1"), LastReport: now.Add(-10 * time.Minute), Now: now, StaleAge: 5 * time.Minute},
			outcome: flow.OutcomeFail, code: flow.CodeHostStale, inWhy: "cmp1 last reported"},
		{name: "fresh host", d: policy.Decision{Intents: []policy.Intent{attach(policy.ModeDirectLive)}},
			f:       Facts{Instance: known("cmp1"), LastReport: now.Add(-time.Minute), Now: now, StaleAge: 5 * time.Minute},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepAttach}, mode: protocol.ModeLive},
		{name: "release what is attached", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease, Profile: "T4-4Q", Count: 1}}},
			f: Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{att(flow.AttAttached, "T4-4Q")}}, outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepRelease}},
		{name: "release with nothing attached", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease, Count: 1}}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeReject, code: flow.CodeRefused, inWhy: "holds no vGPU"},
		{name: "release of a flavor's vGPU through Nova", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease}}},
			f: Facts{Instance: withFlavorVGPUs(known("cmp1"), 1)}, outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepNovaResize}},
		{name: "release of a deleted instance's flavor vGPU", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease}}},
			f: Facts{Instance: withFlavorVGPUs(known("cmp1"), 1), Deleting: true}, outcome: flow.OutcomeReject, code: flow.CodeRefused},
		{name: "release takes direct vGPUs before the flavor's", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease, Count: 1}}},
			f:       Facts{Instance: withFlavorVGPUs(known("cmp1"), 1), Attachments: []flow.Attachment{att(flow.AttAttached, "T4-4Q")}},
			outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepRelease}},
		{name: "release while attaching", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease, Count: 1}}},
			f: Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{att(flow.AttPending, "T4-4Q")}}, outcome: flow.OutcomeFail, code: flow.CodeBusy},
		{name: "resize not in this build", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentResize, Profile: "T4-8Q"}}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeFail, code: flow.CodeUnsupported},
		{name: "limits", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentSetLimits, CPUMax: "800000 100000", MemoryHigh: "64G"}}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeAct, steps: []flow.StepKind{flow.StepCommand}},
		{name: "notify only", d: policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentNotify, Message: "hi"}}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeNothing, code: flow.CodeNoAction, steps: []flow.StepKind{flow.StepNotify}},
		{name: "refused by policy", d: policy.Decision{Refused: []policy.Refusal{{Reason: "quota: 4 vGPUs per project"}}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeReject, code: flow.CodeRefused, inWhy: "quota"},
		{name: "no rule", d: policy.Decision{Kind: "webhook.GPU_LOAD"}, f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeNothing, code: flow.CodeNoAction,
			inWhy: "no policy rule listens"},
		{name: "load rule holding", d: policy.Decision{Rules: []policy.RuleTrace{{Rule: "scale-up", Outcome: policy.OutcomeHolding, Detail: "held 1m of 5m"}}},
			f: Facts{Instance: known("cmp1")}, outcome: flow.OutcomeNothing, code: flow.CodeNoAction, inWhy: "scale-up: held 1m of 5m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PlanDecision(&tt.d, tt.f)
			if got.Outcome != tt.outcome || (tt.code != "" && got.Code != tt.code) {
				t.Fatalf("outcome %s code %s (%s), want %s %s", got.Outcome, got.Code, got.Reason, tt.outcome, tt.code)
			}
			if tt.inWhy != "" && !strings.Contains(got.Reason, tt.inWhy) {
				t.Errorf("reason %q does not contain %q", got.Reason, tt.inWhy)
			}
			var kinds []flow.StepKind
			for _, s := range got.Steps {
				kinds = append(kinds, s.Kind)
			}
			if strings.Join(stepNames(kinds), ",") != strings.Join(stepNames(tt.steps), ",") {
				t.Errorf("steps %v, want %v", kinds, tt.steps)
			}
			if tt.mode != "" && got.Steps[0].Mode != tt.mode {
				t.Errorf("mode %s, want %s", got.Steps[0].Mode, tt.mode)
			}
		})
	}
}

func stepNames(ks []flow.StepKind) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = string(k)
	}
	return out
}

func TestPlanReleaseTakesCountAndProfile(t *testing.T) {
	a1, a2, a3 := att(flow.AttAttached, "T4-4Q"), att(flow.AttAttached, "T4-8Q"), att(flow.AttAttached, "T4-4Q")
	d := &policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease, Profile: "T4-4Q", Count: 1}}}
	p := PlanDecision(d, Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{a1, a2, a3}})
	if len(p.Steps) != 1 || len(p.Steps[0].Release) != 1 || p.Steps[0].Release[0].ID != a1.ID {
		t.Fatalf("steps %+v, want a release of the first T4-4Q only", p.Steps)
	}
	d = &policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentRelease, Count: 3}}}
	p = PlanDecision(d, Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{a1, a2, a3}, Deleting: true})
	if len(p.Steps[0].Release) != 3 || !p.Steps[0].RemoveOnly {
		t.Fatalf("release of a deleted instance: %+v", p.Steps[0])
	}
}

func TestPlanReattachAfterRebuild(t *testing.T) {
	a1, a2 := att(flow.AttAttached, "T4-4Q"), att(flow.AttPending, "T4-4Q")
	a1.Host = "cmp1"
	p := PlanDecision(&policy.Decision{Kind: "nova.instance.power_on.end"}, Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{a1, a2}, Rebuilt: true})
	if p.Outcome != flow.OutcomeAct || len(p.Steps) != 1 || p.Steps[0].Kind != flow.StepReattach || len(p.Steps[0].Release) != 1 || p.Steps[0].Release[0].ID != a1.ID {
		t.Fatalf("plan %+v, want one reattach of the attached vGPU", p)
	}
	// Moved to another host (its claim went with Nova's move): not here.
	p = PlanDecision(&policy.Decision{}, Facts{Instance: known("cmp2"), Attachments: []flow.Attachment{a1}, Rebuilt: true})
	if p.Outcome != flow.OutcomeNothing {
		t.Fatalf("plan %+v, want nothing", p)
	}
}

func TestMemoryBytes(t *testing.T) {
	for in, want := range map[string]string{"": "", "max": "max", "64G": "68719476736", "512M": "536870912", "1Gi": "1073741824",
		"2048": "2048", "1K": "1024", "3T": "3298534883328"} {
		got, err := MemoryBytes(in)
		if err != nil || got != want {
			t.Errorf("MemoryBytes(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"G", "-1G", "1.5G", "lots", "0", "99999999999T"} {
		if got, err := MemoryBytes(bad); err == nil {
			t.Errorf("MemoryBytes(%q) = %q, want an error", bad, got)
		}
	}
}

func TestMapEvent(t *testing.T) {
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		row  InboxRow
		want policy.Event
	}{
		{name: "native request", row: InboxRow{Source: "webhook:batch", EventType: "GPU_REQUEST", InstanceUUID: inst, OccurredAt: at,
			Payload: json.RawMessage(`{"source":"batch","type":"GPU_REQUEST","vm_id":"` + inst + `","workload":"training","vgpu_profile":"T4-4Q","count":2,"metrics":{"gpu_util":93.5,"note":"x"}}`)},
			want: policy.Event{Kind: policy.KindGPURequest, Source: "batch", InstanceUUID: inst, Workload: "training", Profile: "T4-4Q", Count: 2,
				Metrics: map[string]float64{"gpu_util": 93.5}, Time: at}},
		{name: "alert", row: InboxRow{Source: "webhook:am", EventType: "GPU_LOAD", InstanceUUID: inst, OccurredAt: at,
			Payload: json.RawMessage(`{"source":"am","type":"GPU_LOAD","vm_id":"` + inst + `","metrics":{"gpu_util":"97"},"alert":{"status":"firing","labels":{"alertname":"GPUBusy"}}}`)},
			want: policy.Event{Kind: policy.KindAlert, Source: "am", InstanceUUID: inst, Status: "firing", Labels: map[string]string{"alertname": "GPUBusy"},
				Metrics: map[string]float64{"gpu_util": 97}, Time: at}},
		{name: "nova", row: InboxRow{Source: "nova", EventType: "instance.delete.end", InstanceUUID: inst, ProjectID: "p1", OccurredAt: at},
			want: policy.Event{Kind: "nova.instance.delete.end", Source: "nova", InstanceUUID: inst, ProjectID: "p1", Time: at}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MapEvent(tt.row)
			if err != nil {
				t.Fatal(err)
			}
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(tt.want)
			if string(g) != string(w) {
				t.Errorf("got  %s\nwant %s", g, w)
			}
		})
	}
	if _, err := MapEvent(InboxRow{Source: "webhook:x", Payload: json.RawMessage(`[`)}); err == nil {
		t.Error("broken payload: no error")
	}
}

func FuzzMapEvent(f *testing.F) {
	f.Add(`{"source":"batch","type":"GPU_REQUEST","vm_id":"x","count":1,"metrics":{"gpu_util":1e400}}`)
	f.Add(`{"alert":{"status":"resolved","labels":{"instance":"x"}},"metrics":{"a":"NaN","b":true}}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, payload string) {
		ev, err := MapEvent(InboxRow{Source: "webhook:f", EventType: "GPU_LOAD", Payload: json.RawMessage(payload)})
		if err != nil {
			return
		}
		if ev.Kind == "" {
			t.Errorf("no kind for %q", payload)
		}
		for k, v := range ev.Metrics {
			if v != v {
				t.Errorf("metric %s is NaN", k)
			}
		}
	})
}

func TestHostFromReport(t *testing.T) {
	util := 42.0
	r := protocol.Report{Host: "cmp1", DriverVersion: "550.54.16", GPUs: []protocol.GPU{
		{PCI: "0000:3b:00.0", Types: []protocol.VGPUType{{ID: "nvidia-232", Name: "GRID T4-4Q", MaxInstances: 4}},
			Active: []protocol.VGPU{{TypeID: "nvidia-232", MdevUUID: "m"}}, UtilPercent: &util},
		{PCI: "0000:d8:00.0", Types: []protocol.VGPUType{{ID: "nvidia-232", Name: "GRID T4-4Q", MaxInstances: 4}}},
	}}
	h := HostFromReport(r, catalog.New())
	if h.Name != "cmp1" || h.DriverVersion != "550.54.16" || len(h.GPUs) != 2 {
		t.Fatalf("host %+v", h)
	}
	g := h.GPUs[0]
	if g.Model != "T4" || g.Profile != "T4-4Q" || g.Used != 1 || g.Capacity != 4 || g.Utilization != 42 {
		t.Errorf("gpu %+v", g)
	}
	if h.GPUs[1].Model != "T4" || h.GPUs[1].Used != 0 {
		t.Errorf("empty gpu %+v", h.GPUs[1])
	}
}

func TestNovaHostProblem(t *testing.T) {
	inst := uuid.NewString()
	tests := []struct {
		f    InstanceFacts
		code string
	}{
		{InstanceFacts{UUID: inst, Host: "cmp1", Known: true}, ""},
		{InstanceFacts{UUID: inst}, flow.CodeNoInstance},
		{InstanceFacts{UUID: inst, Host: "cmp1", Known: true, Deleted: true}, flow.CodeNoInstance},
		{InstanceFacts{UUID: inst, Known: true}, flow.CodeNoHost},
	}
	for _, tc := range tests {
		if _, code := novaHostProblem(Facts{Instance: tc.f}); code != tc.code {
			t.Errorf("%+v: code %q, want %q", tc.f, code, tc.code)
		}
	}
}

// TestPlanTuneClocks: tune's clocks_mhz becomes set_clocks (the SM clock;
// the agent keeps the memory clock), a negative one reset_clocks, beside
// the scheduler when one is named, per physical GPU.
func TestPlanTuneClocks(t *testing.T) {
	tune := func(sched string, clocks int) policy.Decision {
		return policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentTune, Scheduler: sched, ClocksMHz: clocks, GPUs: []string{"0000:3b:00.0"}}}}
	}
	tests := []struct {
		name string
		d    policy.Decision
		want []protocol.Kind
	}{
		{"batch window: lower the clocks", tune("", 900), []protocol.Kind{protocol.SetClocks}},
		{"after the window: reset them", tune("", -1), []protocol.Kind{protocol.ResetClocks}},
		{"scheduler and clocks", tune("equal_share", 1200), []protocol.Kind{protocol.SetVGPUScheduler, protocol.SetClocks}},
		{"scheduler only", tune("best_effort", 0), []protocol.Kind{protocol.SetVGPUScheduler}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanDecision(&tc.d, Facts{Instance: known("cmp1")})
			var got []protocol.Kind
			for _, s := range p.Steps {
				got = append(got, s.Command)
				if c, ok := s.Params.(protocol.ClockParams); ok && s.Command == protocol.SetClocks && (c.SMMHz != uint32(tc.d.Intents[0].ClocksMHz) || c.MemoryMHz != 0) {
					t.Errorf("set_clocks params %+v", c)
				}
			}
			if p.Outcome != flow.OutcomeAct || len(got) != len(tc.want) {
				t.Fatalf("outcome %s, commands %v; want %v", p.Outcome, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("commands %v, want %v", got, tc.want)
				}
			}
		})
	}
	if p := PlanDecision(&policy.Decision{Intents: []policy.Intent{{Kind: policy.IntentTune, GPUs: []string{"0000:3b:00.0"}}}}, Facts{Instance: known("cmp1")}); p.Outcome == flow.OutcomeAct {
		t.Errorf("a tune with nothing to set acts: %+v", p)
	}
}

// A workload's frame-rate limiter goes with a direct attach; on the Nova
// path (Nova creates the mdev) the plan says it is not applied, and why.
func TestPlanFrameRateLimit(t *testing.T) {
	off := false
	for _, tt := range []struct {
		name     string
		in       policy.Intent
		f        Facts
		wantNote bool
	}{
		{"direct", attach(policy.ModeDirectLive), Facts{Instance: known("cmp1")}, false},
		{"nova attach", attach(policy.ModeNovaResize), Facts{Instance: known("cmp1")}, true},
		{"nova resize of a flavor's vGPU", resize(policy.ModeDirectLive), Facts{Instance: withFlavorVGPUs(known("cmp1"), 1)}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.FrameRateLimit = &off
			p := PlanDecision(&policy.Decision{Intents: []policy.Intent{tt.in}}, tt.f)
			if p.Outcome != flow.OutcomeAct {
				t.Fatalf("outcome %s: %s", p.Outcome, p.Reason)
			}
			noted := len(p.Notes) == 1 && strings.Contains(p.Notes[0], "frame_rate_limit: not applied") && strings.Contains(p.Notes[0], "Nova creates")
			if noted != tt.wantNote {
				t.Errorf("notes %q, want a frame-rate note: %v", p.Notes, tt.wantNote)
			}
			if !tt.wantNote && (p.Steps[0].Intent.FrameRateLimit == nil || *p.Steps[0].Intent.FrameRateLimit) {
				t.Errorf("direct step lost the limiter: %+v", p.Steps[0].Intent)
			}
		})
	}
	// The attach_vgpu that carries it: package direct (TestAttachCommandsFrameRateLimit).
}

// TestPlanDefersHeldRules: a decision that held a rule back and fired
// none is deferred to the hold's end, with the rule and the time in the
// reason; one where another rule fired acts on what fired.
func TestPlanDefersHeldRules(t *testing.T) {
	until := time.Date(2026, 1, 2, 3, 4, 25, 0, time.UTC)
	held := &policy.Decision{Intents: []policy.Intent{},
		Rules: []policy.RuleTrace{{Rule: "resolved-releases", Outcome: policy.OutcomeCooldown, Detail: "cooldown 20s until 2026-01-02T03:04:25Z"}},
		Held:  []policy.Hold{{Rule: "resolved-releases", Until: until}}}
	p := PlanDecision(held, Facts{Instance: known("cmp1")})
	if p.Outcome != flow.OutcomeDefer || !strings.Contains(p.Reason, "deferred until 2026-01-02T03:04:25Z") || !strings.Contains(p.Reason, "rule resolved-releases") {
		t.Errorf("held, nothing fired: %+v", p)
	}
	mixed := *held
	mixed.Rules = append(mixed.Rules, policy.RuleTrace{Rule: "attach", Outcome: policy.OutcomeFired})
	mixed.Intents = []policy.Intent{attach(policy.ModeDirectLive)}
	if p := PlanDecision(&mixed, Facts{Instance: known("cmp1")}); p.Outcome != flow.OutcomeAct {
		t.Errorf("held, another rule fired: %+v, want it acted on", p)
	}
}

// TestPlanMove: move() takes the bridge's vGPUs on the GPU it leaves to
// another GPU of the host (release, then an attach of the same profile
// whose claim skips the provider left); a flavor's vGPU moves by a cold
// migration through Nova (one nova_resize step, the flavor's count); no
// vGPU there is a note; a change in flight is busy.
func TestPlanMove(t *testing.T) {
	move := policy.Intent{Kind: policy.IntentMove, Instance: inst, GPUs: []string{"0000:3b:00.0"}, Mode: policy.ModeDirectLive, Why: "rule gpu-fault"}
	onA := att(flow.AttAttached, "T4-4Q")
	onA.Trait = "CUSTOM_NVIDIA_232"
	onB := att(flow.AttAttached, "T4-4Q")
	onB.Trait, onB.PCIAddress, onB.Provider = "CUSTOM_NVIDIA_232", "0000:d8:00.0", "rp-b"
	pendingA := att(flow.AttPending, "T4-4Q")
	tests := []struct {
		name    string
		f       Facts
		outcome flow.Outcome
		code    string
		inWhy   string
	}{
		{name: "direct vGPU on the GPU left", f: Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{onA, onB}}, outcome: flow.OutcomeAct},
		{name: "the flavor's vGPU: a cold migration", f: Facts{Instance: withFlavorVGPUs(known("cmp1"), 2)}, outcome: flow.OutcomeAct},
		{name: "the flavor's vGPU, no host", f: Facts{Instance: withFlavorVGPUs(known(""), 1)}, outcome: flow.OutcomeFail, code: flow.CodeNoHost},
		{name: "none on that GPU", f: Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{onB}}, outcome: flow.OutcomeReject,
			code: flow.CodeRefused, inWhy: "no vGPU of the bridge's on GPU 0000:3b:00.0"},
		{name: "a change in flight", f: Facts{Instance: known("cmp1"), Attachments: []flow.Attachment{pendingA}}, outcome: flow.OutcomeFail,
			code: flow.CodeBusy},
		{name: "no host", f: Facts{Instance: known(""), Attachments: []flow.Attachment{onA}}, outcome: flow.OutcomeFail, code: flow.CodeNoHost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := PlanDecision(&policy.Decision{Intents: []policy.Intent{move}}, tt.f)
			if p.Outcome != tt.outcome || p.Code != tt.code || !strings.Contains(p.Reason, tt.inWhy) {
				t.Fatalf("plan %s %s %q, want %s %s containing %q", p.Outcome, p.Code, p.Reason, tt.outcome, tt.code, tt.inWhy)
			}
			if p.Outcome != flow.OutcomeAct {
				return
			}
			if tt.f.Instance.FlavorVGPUs > 0 {
				if len(p.Steps) != 1 || p.Steps[0].Kind != flow.StepNovaResize || p.Steps[0].Intent.Kind != policy.IntentMove ||
					p.Steps[0].Intent.Count != 2 || !slices.Equal(p.Steps[0].Intent.GPUs, move.GPUs) || p.Steps[0].Host != "cmp1" {
					t.Fatalf("steps %+v, want one nova_resize moving the flavor's 2 vGPUs off %v on cmp1", p.Steps, move.GPUs)
				}
				return
			}
			if len(p.Steps) != 2 || p.Steps[0].Kind != flow.StepRelease || p.Steps[1].Kind != flow.StepAttach {
				t.Fatalf("steps %+v, want release then attach", p.Steps)
			}
			if r := p.Steps[0].Release; len(r) != 1 || r[0].ID != onA.ID {
				t.Errorf("released %+v, want only the vGPU on the GPU left", r)
			}
			a := p.Steps[1]
			if a.Intent.Profile != "T4-4Q" || a.Intent.Trait != "CUSTOM_NVIDIA_232" || a.Intent.Count != 1 || a.Mode != protocol.ModeLive {
				t.Errorf("attach %+v mode %s, want 1 × T4-4Q live", a.Intent, a.Mode)
			}
			if len(a.Exclude) != 1 || a.Exclude[0] != onA.Provider {
				t.Errorf("the claim excludes %v, want the provider left %s", a.Exclude, onA.Provider)
			}
		})
	}
}
