package nova_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
)

var update = flag.Bool("update", false, "rewrite testdata/samples.golden")

const samplesDir = "testdata/notification_samples"

// summary is what the golden file records for each sample.
type summary struct {
	Sample      string          `json:"sample"`
	EventType   string          `json:"event_type"`
	Action      string          `json:"action,omitempty"`
	Phase       string          `json:"phase,omitempty"`
	Publisher   string          `json:"publisher"`
	Priority    string          `json:"priority"`
	Object      string          `json:"object"`
	Typed       string          `json:"typed"`
	Unknown     string          `json:"unknown,omitempty"`
	Instance    *instSummary    `json:"instance,omitempty"`
	Flavor      *flavorSummary  `json:"flavor,omitempty"`
	NewFlavor   *flavorSummary  `json:"new_flavor,omitempty"`
	Fault       string          `json:"fault,omitempty"`
	StateUpdate string          `json:"state_update,omitempty"`
	Task        string          `json:"task,omitempty"`
	Service     string          `json:"service,omitempty"`
	Demand      json.RawMessage `json:"demand,omitempty"`
}

type instSummary struct {
	UUID       string `json:"uuid"`
	Project    string `json:"project"`
	Host       string `json:"host"`
	Node       string `json:"node"`
	State      string `json:"state"`
	TaskState  string `json:"task_state"`
	PowerState string `json:"power_state"`
	Deleted    bool   `json:"deleted,omitempty"`
}

type flavorSummary struct {
	Name   string `json:"name"`
	VCPUs  int    `json:"vcpus"`
	Memory int    `json:"memory_mb"`
	Specs  int    `json:"extra_specs"`
	VGPUs  int    `json:"vgpus"`
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func flavorSum(f *nova.Flavor) (*flavorSummary, error) {
	if f == nil {
		return nil, nil
	}
	d, err := nova.ParseExtraSpecs(f.ExtraSpecs)
	if err != nil {
		return nil, err
	}
	return &flavorSummary{Name: f.Name, VCPUs: f.VCPUs, Memory: f.MemoryMB, Specs: len(f.ExtraSpecs), VGPUs: d.VGPUs()}, nil
}

func summarize(name string, m *nova.Message) (summary, error) {
	s := summary{
		Sample: name, EventType: m.EventType, Action: m.Event.Action, Phase: string(m.Event.Phase),
		Publisher: m.PublisherID, Priority: m.Priority,
		Object: m.Payload.Name + " " + m.Payload.Version,
	}
	p, err := m.Decode()
	if err != nil {
		if nova.KindOf(err) != nova.KindUnknownVersion {
			return s, err
		}
		s.Unknown = err.Error()
	}
	s.Typed = fmt.Sprintf("%T", p)
	inst := func(in *nova.Instance) error {
		s.Instance = &instSummary{UUID: in.UUID, Project: in.TenantID, Host: str(in.Host), Node: str(in.Node),
			State: in.State, TaskState: str(in.TaskState), PowerState: in.PowerState, Deleted: !in.DeletedAt.IsZero()}
		s.Flavor, err = flavorSum(in.Flavor)
		if in.Fault != nil {
			s.Fault = in.Fault.Exception + ": " + in.Fault.ExceptionMessage
		}
		return err
	}
	switch p := p.(type) {
	case *nova.InstanceAction:
		if err := inst(&p.Instance); err != nil {
			return s, err
		}
		if s.NewFlavor, err = flavorSum(p.NewFlavor); err != nil {
			return s, err
		}
	case *nova.InstanceUpdate:
		if err := inst(&p.Instance); err != nil {
			return s, err
		}
		if u := p.StateUpdate; u != nil {
			s.StateUpdate = fmt.Sprintf("%s/%s -> %s/%s", u.OldState, str(u.OldTaskState), u.State, str(u.NewTaskState))
		}
	case *nova.Flavor:
		if s.Flavor, err = flavorSum(p); err != nil {
			return s, err
		}
		d, _ := nova.ParseExtraSpecs(p.ExtraSpecs)
		s.Demand, _ = json.Marshal(d)
	case *nova.ComputeTask:
		s.Task = p.InstanceUUID + " " + p.State
		if p.Reason != nil {
			s.Task += " " + p.Reason.Exception
		}
		if p.RequestSpec != nil {
			if s.Flavor, err = flavorSum(p.RequestSpec.Flavor); err != nil {
				return s, err
			}
		}
	case *nova.ServiceStatus:
		s.Service = fmt.Sprintf("%s %s disabled=%v forced_down=%v", p.Binary, p.Host, p.Disabled, p.ForcedDown)
	}
	return s, nil
}

// TestSamplesGolden decodes every Nova sample on the wire (envelope and
// message_id/timestamp added) and compares a summary with the golden file.
func TestSamplesGolden(t *testing.T) {
	samples, err := novatest.Samples(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) < 140 {
		t.Fatalf("found %d samples, want all 140", len(samples))
	}
	ts := time.Date(2024, 5, 1, 12, 0, 0, 123456000, time.UTC)
	var buf bytes.Buffer
	for i, s := range samples {
		body := s.Wire(fmt.Sprintf("msg-%03d", i), ts)
		m, err := nova.Decode(body)
		if err != nil {
			t.Errorf("%s: decode: %v", s.Name, err)
			continue
		}
		if m.MessageID != fmt.Sprintf("msg-%03d", i) || !m.Timestamp.Equal(ts) || m.Envelope != "2.0" {
			t.Errorf("%s: got id %q ts %v envelope %q", s.Name, m.MessageID, m.Timestamp, m.Envelope)
		}
		if m.Context.RequestID == "" || m.Context.ProjectID == "" || m.Context.UserID == "" {
			t.Errorf("%s: context not kept: %+v", s.Name, m.Context)
		}
		sum, err := summarize(s.Name, m)
		if err != nil {
			t.Errorf("%s: %v", s.Name, err)
			continue
		}
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(sum); err != nil {
			t.Fatal(err)
		}
	}
	golden := filepath.Join("testdata", "samples.golden")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./nova -run TestSamplesGolden -update)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		gl, wl := strings.Split(buf.String(), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gl) || i < len(wl); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Errorf("line %d:\n got %s\nwant %s", i+1, g, w)
			}
		}
	}
}

// TestSamplesLegacy decodes every sample in the legacy (messaging, 1.0)
// form: the inner message without the envelope.
func TestSamplesLegacy(t *testing.T) {
	samples, err := novatest.Samples(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range samples {
		var env map[string]string
		if err := json.Unmarshal(s.Wire(fmt.Sprint(i), time.Unix(0, 0)), &env); err != nil {
			t.Fatal(err)
		}
		m, err := nova.Decode([]byte(env["oslo.message"]))
		if err != nil {
			t.Errorf("%s: %v", s.Name, err)
			continue
		}
		if m.Envelope != "" || m.MessageID != fmt.Sprint(i) {
			t.Errorf("%s: envelope %q id %q", s.Name, m.Envelope, m.MessageID)
		}
		if _, err := m.Decode(); err != nil {
			t.Errorf("%s: payload: %v", s.Name, err)
		}
	}
}
