package notify_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
)

// samplesDir holds one sample per event type, as a consumer sees the
// message once oslo.messaging has unpacked the envelope's oslo.message
// (the documentation includes them: doc/source/accounting.rst).
const samplesDir = "../../doc/source/notification_samples"

func init() {
	// -update, unless the package's own tests define it already.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files (doc/source/notification_samples)")
	}
}

func updating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// Example values of the samples: a T4-4Q (nvidia-232, CUSTOM_NVIDIA_232)
// on the first GPU of compute-0012.
const (
	publisherID = "vgpu-bridge:controller-1"
	project     = "6f0c7c1e0a2b4d1c9e8f7a6b5c4d3e2f"
	user        = "8a1b2c3d4e5f46a7b8c9d0e1f2a3b4c5"
	vm          = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01" // the direct-path instance
	vmFlavor    = "5e2a7c9b-3f1d-4b6a-8e0c-9d7f6a5b4c32" // the Nova-path instance
	mdev        = "c3f1a2b4-5d6e-4f70-8a91-b2c3d4e5f601" // the vGPU's attachment id, its mdev UUID
	provider    = "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d" // the GPU's resource provider
)

func t4(state string) notify.VGPU {
	return notify.VGPU{AttachmentID: mdev, Profile: "T4-4Q", VGPUType: "nvidia-232", ResourceClass: "VGPU", Amount: 1,
		Host: "compute-0012", ProviderUUID: provider, PCIAddress: "0000:3b:00.0", State: state}
}

type sample struct {
	eventType string
	priority  notify.Priority
	messageID string
	at        time.Time
	payload   notify.Object
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func samples() []sample {
	attach := notify.ActionPayload{RequestID: "3f6d2b8a-1c4e-4a7f-9b2d-6e8c0a1f3b57", RequestKind: "GPU_REQUEST",
		Source: "webhook:batch-scheduler", InstanceUUID: vm, ProjectID: project, UserID: user, Path: "direct"}
	attachStart, attachEnd := attach, attach
	attachStart.State, attachStart.Reason = "decided", "attach 1 × T4-4Q on compute-0012 GPU 0000:3b:00.0"
	attachStart.VGPUs = []notify.VGPU{t4("pending")}
	attachEnd.State, attachEnd.Reason = "succeeded", "1 vGPU(s) attached"
	attachEnd.VGPUs = []notify.VGPU{t4("attached")}

	detach := notify.ActionPayload{RequestID: "7a9e4c1d-2b8f-4d6a-a3c5-e7f9b1d3a5c8", RequestKind: "GPU_RELEASE",
		Source: "webhook:batch-scheduler", InstanceUUID: vm, ProjectID: project, UserID: user, Path: "direct"}
	detachStart, detachEnd := detach, detach
	detachStart.State, detachStart.Reason = "decided", "release T4-4Q (mdev "+mdev+") on compute-0012"
	detachStart.OldVGPUs = []notify.VGPU{t4("releasing")}
	detachEnd.State, detachEnd.Reason = "succeeded", "1 vGPU(s) detached and removed, claim released"
	detachEnd.OldVGPUs = []notify.VGPU{t4("released")}

	// A resize through Nova to a vGPU flavor: the flavor is known once
	// Nova is asked, the host once Nova has moved the server.
	resize := notify.ActionPayload{RequestID: "c2d4e6f8-0a1b-4c3d-8e5f-a7b9c1d3e5f7", RequestKind: "GPU_RESIZE",
		Source: "webhook:alertmanager", InstanceUUID: vmFlavor, ProjectID: project, UserID: user, Path: "nova"}
	resizeStart, resizeEnd := resize, resize
	resizeStart.State, resizeStart.Reason = "decided", "resize through Nova to a flavor with 1 × T4-8Q"
	resizeStart.VGPUs = []notify.VGPU{{Profile: "T4-8Q", VGPUType: "nvidia-233", ResourceClass: "VGPU", Amount: 1, Host: "compute-0012"}}
	resizeEnd.State = "succeeded"
	resizeEnd.Reason = "resized through Nova to flavor m1.large.vgpu-T4-8Q (1 × T4-8Q) on host compute-0014; " +
		"the agent verified the vGPU; Nova confirmed the resize"
	resizeEnd.Flavor, resizeEnd.OldFlavor = "m1.large.vgpu-T4-8Q", "m1.large.vgpu-T4-4Q"
	resizeEnd.VGPUs = []notify.VGPU{{Profile: "T4-8Q", VGPUType: "nvidia-233", ResourceClass: "VGPU", Amount: 1, Host: "compute-0014"}}

	// A request refused before it changed anything: no vGPU in it.
	refused := notify.ActionPayload{RequestID: "e1f3a5b7-c9d2-4e4f-b6a8-c0d2e4f6a8b1", RequestKind: "GPU_REQUEST",
		Source: "webhook:batch-scheduler", InstanceUUID: "9b8c7d6e-5f4a-4b3c-a2d1-e0f9a8b7c6d5", ProjectID: project, UserID: user,
		State: "rejected", Code: "no_capacity", Reason: "no GPU with 2 free unit(s) of T4-4Q (CUSTOM_NVIDIA_232) on any host"}

	exists := notify.ExistsPayload{InstanceUUID: vm, ProjectID: project, UserID: user, Path: "direct", AttachmentID: mdev,
		Host: "compute-0012", Profile: "T4-4Q", VGPUType: "nvidia-232", ResourceClass: "VGPU", Amount: 1,
		Seconds: 2718, VGPUSeconds: 2718, AuditPeriod: notify.AuditPeriod("2026-12-05T12:00:00Z", "2026-12-05T13:00:00Z")}

	// A rule's notify(message) on the request that attached the vGPU.
	told := notify.NotifyPayload{RequestID: "3f6d2b8a-1c4e-4a7f-9b2d-6e8c0a1f3b57", RequestKind: "GPU_REQUEST",
		Source: "webhook:batch-scheduler", InstanceUUID: vm, ProjectID: project, UserID: user, Rule: "tell-training-tenants",
		Message: "your training VM got a T4-4Q on a GPU shared with other tenants; its clocks are the operator's",
		Why:     `event.workload = "training"`}
	fault := notify.GPUFaultPayload{ProviderUUID: provider, Host: "compute-0012", Node: "compute-0012.example.org", PCIAddress: "0000:3b:00.0",
		Source: "xid", Xid: 79, Reason: "Xid 79: GPU has fallen off the bus", Trait: "CUSTOM_VGPU_BRIDGE_GPU_FAULT", Instances: []string{vm}}

	return []sample{
		{notify.PolicyNotify, notify.Info, "0c4e8a2f-6b1d-4f3a-9e7c-5d2b8f1a4c63", at("2026-12-05T12:14:40.305521Z"), notify.NotifyObject(told)},
		{notify.AttachStart, notify.Info, "2b7e4f1a-9c3d-4e8b-a6f0-1d5c9e3b7a24", at("2026-12-05T12:14:40.201337Z"), notify.Action(attachStart)},
		{notify.AttachEnd, notify.Info, "4d9a6c3e-1b5f-4a0d-8c2e-3f7b1a5d9c46", at("2026-12-05T12:14:42.518004Z"), notify.Action(attachEnd)},
		{notify.Exists, notify.Info, "8f3b1d5a-7e9c-4b2f-9a4d-6c0e8b2f4a17", at("2026-12-05T13:00:03.004512Z"), notify.ExistsObject(exists)},
		{notify.DetachStart, notify.Info, "6a1c8e4b-3d7f-4c9a-b2e6-5f1d3c7a9e58", at("2026-12-05T14:02:10.730912Z"), notify.Action(detachStart)},
		{notify.DetachEnd, notify.Info, "9c5e2a7f-4b1d-4e6c-a8f3-7b2d6e0c4a91", at("2026-12-05T14:02:12.066185Z"), notify.Action(detachEnd)},
		{notify.ResizeStart, notify.Info, "1e7c3a9d-5f2b-4d8e-b0a6-9c4f2e8a6d13", at("2026-12-05T15:20:00.112233Z"), notify.Action(resizeStart)},
		{notify.ResizeEnd, notify.Info, "5b3f9d1c-8a6e-4f2b-9d7c-1e5a3f9b7d35", at("2026-12-05T15:22:41.908765Z"), notify.Action(resizeEnd)},
		{notify.RequestError, notify.Error, "7d1b5f3e-2c8a-4b6d-a0e4-8f2c6a4e0b62", at("2026-12-05T16:45:09.554433Z"), notify.Action(refused)},
		{notify.GPUFault, notify.Error, "3c8e1a5f-7b2d-4f9a-8e6c-2d4f6a8b0c13", at("2026-12-05T17:03:27.481516Z"), notify.GPUFaultObject(fault)},
	}
}

// sampleFile is a sample's file name: its event type with dashes, as
// Nova names its samples.
func sampleFile(eventType string) string { return strings.ReplaceAll(eventType, ".", "-") + ".json" }

// consumerView unpacks body as oslo.messaging's notification listener
// does: the message is the envelope's oslo.message, whose _unique_id the
// driver takes out to drop duplicates. The fields keep the order they are
// sent in.
func consumerView(t *testing.T, body []byte, messageID string) []byte {
	t.Helper()
	var env map[string]string
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("envelope: %v", err)
	}
	if env["oslo.version"] != "2.0" || len(env) != 2 {
		t.Fatalf("envelope keys: %v", env)
	}
	var m struct {
		MessageID   string          `json:"message_id"`
		PublisherID string          `json:"publisher_id"`
		EventType   string          `json:"event_type"`
		Priority    string          `json:"priority"`
		Payload     json.RawMessage `json:"payload"`
		Timestamp   string          `json:"timestamp"`
		UniqueID    string          `json:"_unique_id"`
	}
	dec := json.NewDecoder(strings.NewReader(env["oslo.message"]))
	dec.DisallowUnknownFields() // a field Envelope adds must show in the samples
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("oslo.message: %v (a new field? add it to the samples)", err)
	}
	if m.MessageID != messageID || m.UniqueID != strings.ReplaceAll(messageID, "-", "") {
		t.Fatalf("message_id %s, _unique_id %s: want %s and it without dashes", m.MessageID, m.UniqueID, messageID)
	}
	out, err := json.Marshal(struct {
		MessageID   string          `json:"message_id"`
		PublisherID string          `json:"publisher_id"`
		EventType   string          `json:"event_type"`
		Priority    string          `json:"priority"`
		Payload     json.RawMessage `json:"payload"`
		Timestamp   string          `json:"timestamp"`
	}{m.MessageID, m.PublisherID, m.EventType, m.Priority, m.Payload, m.Timestamp})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := json.Indent(&b, out, "", "    "); err != nil {
		t.Fatal(err)
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// TestNotificationSamples: each file of doc/source/notification_samples
// is what the bridge sends for its event type, built from the Go types
// (go test ./bridge/notify -run TestNotificationSamples -update rewrites
// them); every event type has one and there is no other.
func TestNotificationSamples(t *testing.T) {
	want := []string{notify.AttachStart, notify.AttachEnd, notify.DetachStart, notify.DetachEnd, notify.ResizeStart, notify.ResizeEnd,
		notify.RequestError, notify.Exists, notify.PolicyNotify, notify.GPUFault}
	var files []string
	for _, s := range samples() {
		t.Run(s.eventType, func(t *testing.T) {
			payload, err := json.Marshal(s.payload)
			if err != nil {
				t.Fatal(err)
			}
			body, err := notify.Envelope(uuid.MustParse(s.messageID), publisherID, s.eventType, string(s.priority), payload, s.at)
			if err != nil {
				t.Fatal(err)
			}
			got := consumerView(t, body, s.messageID)
			path := filepath.Join(samplesDir, sampleFile(s.eventType))
			if updating() {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			disk, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./bridge/notify -run TestNotificationSamples -update writes it)", err)
			}
			if !bytes.Equal(disk, got) {
				t.Errorf("%s is not what the bridge sends (-update rewrites it)\n--- sent\n%s--- file\n%s", path, got, disk)
			}
			checkSample(t, disk, s)
		})
		files = append(files, sampleFile(s.eventType))
	}
	for _, e := range want {
		if !slices.Contains(files, sampleFile(e)) {
			t.Errorf("event type %s has no sample", e)
		}
	}
	entries, err := os.ReadDir(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !slices.Contains(files, e.Name()) {
			t.Errorf("%s/%s is the sample of no event type the bridge sends", samplesDir, e.Name())
		}
	}
}

// checkSample reads a sample back as a consumer would: the versioned
// object's name, namespace and version, the priority and the time.
func checkSample(t *testing.T, file []byte, s sample) {
	t.Helper()
	var m struct {
		EventType string `json:"event_type"`
		Priority  string `json:"priority"`
		Timestamp string `json:"timestamp"`
		Payload   struct {
			Name      string          `json:"versioned_object.name"`
			Namespace string          `json:"versioned_object.namespace"`
			Version   string          `json:"versioned_object.version"`
			Data      json.RawMessage `json:"versioned_object.data"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(file, &m); err != nil {
		t.Fatal(err)
	}
	if m.EventType != s.eventType || m.Priority != string(s.priority) || m.Payload.Namespace != notify.Namespace ||
		m.Payload.Name != s.payload.Name || m.Payload.Version != s.payload.Version {
		t.Errorf("sample header: %+v", m)
	}
	if ts, err := time.Parse("2006-01-02 15:04:05.000000", m.Timestamp); err != nil || !ts.Equal(s.at) {
		t.Errorf("timestamp %q (%v), want %s", m.Timestamp, err, s.at)
	}
	// The data reads back into the Go type, field for field.
	dec := json.NewDecoder(bytes.NewReader(m.Payload.Data))
	dec.DisallowUnknownFields()
	switch s.payload.Name {
	case "VGPUActionPayload":
		var p notify.ActionPayload
		if err := dec.Decode(&p); err != nil {
			t.Errorf("VGPUActionPayload: %v", err)
		}
	case "VGPUNotifyPayload":
		var p notify.NotifyPayload
		if err := dec.Decode(&p); err != nil || p.Message == "" || p.Rule == "" {
			t.Errorf("VGPUNotifyPayload: %+v %v", p, err)
		}
	case "VGPUGPUFaultPayload":
		var p notify.GPUFaultPayload
		if err := dec.Decode(&p); err != nil {
			t.Errorf("VGPUGPUFaultPayload: %v", err)
		}
		if p.ProviderUUID == "" || p.Reason == "" || p.Trait != "CUSTOM_VGPU_BRIDGE_GPU_FAULT" {
			t.Errorf("GPU fault payload without its GPU, reason or trait: %+v", p)
		}
	case "VGPUExistsPayload":
		// The nested audit period is Nova's AuditPeriodPayload 1.0.
		var p struct {
			notify.ExistsPayload
			AuditPeriod struct {
				Name      string `json:"versioned_object.name"`
				Namespace string `json:"versioned_object.namespace"`
				Version   string `json:"versioned_object.version"`
				Data      struct {
					Beginning string `json:"audit_period_beginning"`
					Ending    string `json:"audit_period_ending"`
				} `json:"versioned_object.data"`
			} `json:"audit_period"`
		}
		if err := dec.Decode(&p); err != nil {
			t.Errorf("VGPUExistsPayload: %v", err)
		}
		if p.VGPUSeconds != p.Seconds*int64(p.Amount) {
			t.Errorf("vgpu_seconds %d is not seconds %d × amount %d", p.VGPUSeconds, p.Seconds, p.Amount)
		}
		ap := p.AuditPeriod
		begin, err1 := time.Parse(time.RFC3339, ap.Data.Beginning)
		end, err2 := time.Parse(time.RFC3339, ap.Data.Ending)
		if ap.Name != "AuditPeriodPayload" || ap.Version != "1.0" || err1 != nil || err2 != nil ||
			p.Seconds > int64(end.Sub(begin)/time.Second) || s.at.Before(end) {
			t.Errorf("audit period %+v: seconds %d, sent at %s", ap, p.Seconds, s.at)
		}
	default:
		t.Errorf("unknown payload %s", s.payload.Name)
	}
}
