package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var (
	issued  = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	expires = issued.Add(5 * time.Minute)
)

const (
	instUUID = "8f0d4b5e-3c1a-4a59-9d43-6a2b7c1e0f11"
	mdevUUID = "4b20d080-1b54-4048-85b3-a6a62d165c01"
)

func cmd(t *testing.T, id string, k Kind, params any) Command {
	t.Helper()
	c := Command{V: Version, ID: id, Kind: k, Host: "compute-0012", RequestID: "req-1",
		InstanceUUID: instUUID, IssuedAt: issued, ExpiresAt: expires}
	if params != nil {
		if err := c.MarshalParams(params); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func u32(v uint64) *uint64   { return &v }
func f64(v float64) *float64 { return &v }
func iptr(v int) *int        { return &v }

// messages are one of each message, written to testdata/<name>.json.
func messages(t *testing.T) map[string]any {
	return map[string]any{
		"command_create_mdev": cmd(t, "c-create", CreateMdev, MdevParams{MdevUUID: mdevUUID, ParentPCI: "0000:3b:00.0", TypeID: "nvidia-232"}),
		"command_create_mdev_vfio": cmd(t, "c-create-vf", CreateMdev,
			MdevParams{ParentPCI: "0000:41:00.4", TypeID: "1428", VendorVFIO: true}),
		"command_remove_mdev": cmd(t, "c-remove", RemoveMdev, MdevParams{MdevUUID: mdevUUID}),
		"command_attach_vgpu": cmd(t, "c-attach", AttachVGPU, AttachParams{MdevUUID: mdevUUID,
			ParentPCI: "0000:3b:00.0", TypeID: "nvidia-232", Mode: ModeCold, ShutdownTimeoutSeconds: 120}),
		"command_detach_vgpu":         cmd(t, "c-detach", DetachVGPU, AttachParams{MdevUUID: mdevUUID, Mode: ModeLive}),
		"command_set_vgpu_scheduler":  cmd(t, "c-sched", SetVGPUScheduler, SchedulerParams{GPUPCI: "0000:3b:00.0", Policy: SchedFixedShare, TimesliceUs: 2000}),
		"command_set_clocks":          cmd(t, "c-clocks", SetClocks, ClockParams{GPUPCI: "0000:3b:00.0", MemoryMHz: 5001, SMMHz: 1590}),
		"command_reset_clocks":        cmd(t, "c-reset", ResetClocks, ClockParams{GPUPCI: "0000:3b:00.0"}),
		"command_set_vm_limits":       cmd(t, "c-limits", SetVMLimits, LimitParams{CPUMax: "200000 100000", MemoryHigh: "8589934592"}),
		"command_verify_vgpu":         cmd(t, "c-verify", VerifyVGPU, VerifyParams{TypeID: "nvidia-232", Count: 1}),
		"command_collect_diagnostics": cmd(t, "c-diag", CollectDiagnostics, DiagnosticsParams{}),
		"command_upgrade_driver":      cmd(t, "c-upgrade", UpgradeDriver, UpgradeParams{Branch: "570", Version: "570.133.10"}),
		"command_retype_gpus": cmd(t, "c-retype", RetypeGPUs, RetypeParams{GPUs: []RetypeGPU{{PCI: "0000:d8:00.0", From: "nvidia-232",
			To: "nvidia-222", Provider: "compute-0012.example.org_pci_0000_d8_00_0", ProviderUUID: "9e1c07f3-15a3-408a-931f-4b41599b1cc0",
			FromTrait: "CUSTOM_NVIDIA_232", ToTrait: "CUSTOM_NVIDIA_222"}},
			NovaConf: "[devices]\nenabled_mdev_types = nvidia-222, nvidia-232\n\n[mdev_nvidia-222]\ndevice_addresses = 0000:d8:00.0\n\n" +
				"[mdev_nvidia-232]\ndevice_addresses = 0000:3b:00.0\n"}),
		"result_succeeded": Result{V: Version, CommandID: "c-attach", Host: "compute-0012", Status: Succeeded,
			Details: json.RawMessage(`{"steps":["mdev_created","shutdown","defined","started"]}`), FinishedAt: issued.Add(time.Minute)},
		"result_failed": Result{V: Version, CommandID: "c-create", Host: "compute-0012", Status: Failed, Code: "no_capacity",
			NvidiaCode: 48, Message: "create mdev: available_instances is 0",
			Remediation: "No instances of this vGPU type are left on the GPU: pick another GPU or free an mdev (see `vgpu-agent diagnose`).",
			FinishedAt:  issued.Add(time.Second)},
		"result_refused": Result{V: Version, CommandID: "c-old", Host: "compute-0012", Status: Refused, Code: CodeExpired,
			Message: "command expired at 2025-03-01T12:05:00Z", FinishedAt: issued.Add(time.Hour)},
		"report": Report{V: Version, Host: "compute-0012", Node: "compute-0012.example.org", AgentVersion: "1.0.0",
			DriverVersion: "550.54.16", CgroupVersion: 2, SentAt: issued, Seq: 7,
			GPUs: []GPU{{PCI: "0000:3b:00.0", UUID: "GPU-1c5e1d9a-0000-0000-0000-000000000001", Name: "Tesla T4",
				DriverVersion: "550.54.16",
				Types:         []VGPUType{{ID: "nvidia-232", Name: "GRID T4-4Q", FramebufferMiB: 4096, MaxInstances: 4, AvailableInstances: 3}},
				Active:        []VGPU{{MdevUUID: mdevUUID, TypeID: "nvidia-232", InstanceUUID: instUUID, Owner: OwnerAgent}},
				Health:        HealthOK, UtilPercent: f64(12.5), MemoryUsedMiB: u32(4096), MemoryTotalMiB: u32(16384),
				TemperatureC: iptr(41), PowerW: f64(27.3)},
				{PCI: "0000:41:00.4", PhysFn: "0000:41:00.0", VendorVFIO: true, Types: []VGPUType{}, Health: HealthUnknown,
					Active: []VGPU{{PCI: "0000:41:00.4", TypeID: "1428", Owner: OwnerNova}}}},
			Errors: []string{"nvml: unavailable"}},
	}
}

// TestGolden checks each message against testdata/<name>.json and that it
// decodes back to the same value (run with -update to rewrite).
func TestGolden(t *testing.T) {
	for name, m := range messages(t) {
		t.Run(name, func(t *testing.T) {
			got, err := json.MarshalIndent(m, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s changed; the wire format is a contract (package agent/protocol).\ngot:\n%s\nwant:\n%s", path, got, want)
			}
			back := reflect.New(reflect.TypeOf(m))
			switch strings.SplitN(name, "_", 2)[0] {
			case "command":
				c, err := DecodeCommand(want)
				if err != nil {
					t.Fatal(err)
				}
				back.Elem().Set(reflect.ValueOf(c))
			case "result":
				r, err := DecodeResult(want)
				if err != nil {
					t.Fatal(err)
				}
				back.Elem().Set(reflect.ValueOf(r))
			case "report":
				r, err := DecodeReport(want)
				if err != nil {
					t.Fatal(err)
				}
				back.Elem().Set(reflect.ValueOf(r))
			}
			again, _ := json.MarshalIndent(back.Elem().Interface(), "", "  ")
			if !bytes.Equal(append(again, '\n'), want) {
				t.Errorf("round trip differs:\n%s", again)
			}
		})
	}
}

// TestCommandFieldsAlwaysPresent: the signature fields are in every command,
// empty or not (package agent/protocol).
func TestCommandFieldsAlwaysPresent(t *testing.T) {
	b, _ := json.Marshal(Command{V: 1})
	for _, f := range []string{`"v"`, `"id"`, `"kind"`, `"host"`, `"issued_at"`, `"expires_at"`, `"key_id"`, `"sig"`} {
		if !bytes.Contains(b, []byte(f)) {
			t.Errorf("%s missing from %s", f, b)
		}
	}
}

func TestDecodeCommandErrors(t *testing.T) {
	good := `{"v":1,"id":"c1","kind":"verify_vgpu","host":"h","expires_at":"2025-03-01T12:00:00Z","key_id":"","sig":""}`
	if _, err := DecodeCommand([]byte(good)); err != nil {
		t.Fatalf("good: %v", err)
	}
	tests := []struct{ name, body, wantID string }{
		{"empty", ``, ""},
		{"array", `[]`, ""},
		{"not json", `{"v":1,`, ""},
		{"trailing", good + `{}`, ""},
		{"version", strings.Replace(good, `"v":1`, `"v":2`, 1), "c1"},
		{"no id", strings.Replace(good, `"id":"c1"`, `"id":""`, 1), ""},
		{"bad id", strings.Replace(good, `"id":"c1"`, `"id":"a/b"`, 1), "a/b"},
		{"kind", strings.Replace(good, `verify_vgpu`, `format_disk`, 1), "c1"},
		{"no host", strings.Replace(good, `"host":"h"`, `"host":""`, 1), "c1"},
		{"no expiry", strings.Replace(good, `"expires_at":"2025-03-01T12:00:00Z",`, ``, 1), "c1"},
		{"bad instance", strings.Replace(good, `"host":"h"`, `"host":"h","instance_uuid":"x"`, 1), "c1"},
		{"bad time", strings.Replace(good, `2025-03-01T12:00:00Z`, `yesterday`, 1), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := DecodeCommand([]byte(tt.body))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if c.ID != tt.wantID {
				t.Errorf("id = %q, want %q", c.ID, tt.wantID)
			}
		})
	}
}

func TestParamsValidate(t *testing.T) {
	tests := []struct {
		name   string
		kind   Kind
		params string
		target any
		ok     bool
	}{
		{"create ok", CreateMdev, `{"mdev_uuid":"` + mdevUUID + `","parent_pci":"0000:3b:00.0","type_id":"nvidia-232"}`, &MdevParams{}, true},
		{"create no type", CreateMdev, `{"mdev_uuid":"` + mdevUUID + `","parent_pci":"0000:3b:00.0"}`, &MdevParams{}, false},
		{"create bad uuid", CreateMdev, `{"mdev_uuid":"nope","parent_pci":"0000:3b:00.0","type_id":"nvidia-232"}`, &MdevParams{}, false},
		{"create vfio ok", CreateMdev, `{"parent_pci":"0000:41:00.4","type_id":"1428","vendor_vfio":true}`, &MdevParams{}, true},
		{"create vfio named type", CreateMdev, `{"parent_pci":"0000:41:00.4","type_id":"nvidia-1","vendor_vfio":true}`, &MdevParams{}, false},
		{"remove ok", RemoveMdev, `{"mdev_uuid":"` + mdevUUID + `"}`, &MdevParams{}, true},
		{"remove vfio", RemoveMdev, `{"parent_pci":"0000:41:00.4","vendor_vfio":true}`, &MdevParams{}, true},
		{"params wrong type", RemoveMdev, `{"mdev_uuid":5}`, &MdevParams{}, false},
		{"params not object", RemoveMdev, `"x"`, &MdevParams{}, false},
		{"attach ok", AttachVGPU, `{"mdev_uuid":"` + mdevUUID + `","mode":"live"}`, &AttachParams{}, true},
		{"attach bad mode", AttachVGPU, `{"mdev_uuid":"` + mdevUUID + `","mode":"hot"}`, &AttachParams{}, false},
		{"attach half create", AttachVGPU, `{"mdev_uuid":"` + mdevUUID + `","mode":"live","type_id":"nvidia-232"}`, &AttachParams{}, false},
		{"attach vfio", AttachVGPU, `{"parent_pci":"0000:41:00.4","vendor_vfio":true,"mode":"config"}`, &AttachParams{}, true},
		{"attach neg timeout", AttachVGPU, `{"mdev_uuid":"` + mdevUUID + `","mode":"cold","shutdown_timeout_seconds":-1}`, &AttachParams{}, false},
		{"sched ok", SetVGPUScheduler, `{"gpu_pci":"0000:3b:00.0","policy":"equal_share"}`, &SchedulerParams{}, true},
		{"sched bad", SetVGPUScheduler, `{"gpu_pci":"0000:3b:00.0","policy":"round_robin"}`, &SchedulerParams{}, false},
		{"clocks ok", SetClocks, `{"gpu_pci":"0000:3b:00.0","memory_mhz":5001,"sm_mhz":1590}`, &ClockParams{}, true},
		{"clocks missing", SetClocks, `{"gpu_pci":"0000:3b:00.0"}`, &ClockParams{}, false},
		{"reset ok", ResetClocks, `{"gpu_pci":"0000:3b:00.0"}`, &ClockParams{}, true},
		{"limits ok", SetVMLimits, `{"cpu_max":"max 100000","memory_high":"max"}`, &LimitParams{}, true},
		{"limits cpu only quota", SetVMLimits, `{"cpu_max":"50000"}`, &LimitParams{}, true},
		{"limits bad cpu", SetVMLimits, `{"cpu_max":"50%"}`, &LimitParams{}, false},
		{"limits bad mem", SetVMLimits, `{"memory_high":"8G"}`, &LimitParams{}, false},
		{"limits none", SetVMLimits, `{}`, &LimitParams{}, false},
		{"verify none", VerifyVGPU, ``, &VerifyParams{}, true},
		{"verify null", VerifyVGPU, `null`, &VerifyParams{}, true},
		{"verify neg", VerifyVGPU, `{"count":-1}`, &VerifyParams{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Command{Kind: tt.kind, Params: json.RawMessage(tt.params)}
			err := c.DecodeParams(tt.target)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("err %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestExpired(t *testing.T) {
	c := Command{ExpiresAt: expires}
	if c.Expired(expires, 0) || !c.Expired(expires.Add(time.Nanosecond), 0) || c.Expired(expires.Add(time.Second), 2*time.Second) {
		t.Error("Expired boundaries wrong")
	}
}

func TestUpgradeParamsValidate(t *testing.T) {
	for _, tc := range []struct {
		p  UpgradeParams
		ok bool
	}{
		{UpgradeParams{Branch: "570"}, true},
		{UpgradeParams{Branch: "570", Version: "570.133.10"}, true},
		{UpgradeParams{Branch: "535", Version: "535.247"}, true},
		{UpgradeParams{}, false},
		{UpgradeParams{Branch: "570; rm -rf /"}, false},
		{UpgradeParams{Branch: "R570"}, false},
		{UpgradeParams{Branch: "570", Version: "550.54.16"}, false},
		{UpgradeParams{Branch: "570", Version: "570.1 $(id)"}, false},
	} {
		err := tc.p.Validate(UpgradeDriver)
		if (err == nil) != tc.ok {
			t.Errorf("%+v: err = %v, want ok=%v", tc.p, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v does not wrap ErrInvalid", tc.p, err)
		}
	}
}

func TestTopologyNames(t *testing.T) {
	got := []string{CommandRoutingKey("a.b"), AgentQueue("a.b"), ResultRoutingKey("a.b"), ReportRoutingKey("a.b")}
	want := []string{"agent.a.b", "vgpu.agent.a.b", "result.a.b", "report.a.b"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func FuzzDecodeCommand(f *testing.F) {
	for _, n := range []string{"command_create_mdev", "command_attach_vgpu", "command_set_vm_limits", "command_create_mdev_vfio",
		"command_upgrade_driver", "command_retype_gpus"} {
		b, err := os.ReadFile(filepath.Join("testdata", n+".json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":1,"id":"x","kind":"verify_vgpu","host":"h","expires_at":"2025-01-01T00:00:00Z","params":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		// A valid command decodes its params without panicking, whatever they are.
		var targets = map[Kind]any{CreateMdev: &MdevParams{}, RemoveMdev: &MdevParams{}, AttachVGPU: &AttachParams{},
			DetachVGPU: &AttachParams{}, SetVGPUScheduler: &SchedulerParams{}, SetClocks: &ClockParams{},
			ResetClocks: &ClockParams{}, SetVMLimits: &LimitParams{}, VerifyVGPU: &VerifyParams{},
			CollectDiagnostics: &DiagnosticsParams{}, UpgradeDriver: &UpgradeParams{}, RetypeGPUs: &RetypeParams{}}
		if err := c.DecodeParams(targets[c.Kind]); err == nil && c.Kind == UpgradeDriver {
			// What reaches the agent's upgrade command's environment is digits and dots only.
			p := targets[c.Kind].(*UpgradeParams)
			if strings.Trim(p.Branch+p.Version, "0123456789.") != "" {
				t.Fatalf("upgrade params %+v accepted", p)
			}
		}
		if err := c.DecodeParams(targets[c.Kind]); err == nil && c.Kind == RetypeGPUs {
			// What reaches the re-type command's environment holds no line break but between GPUs.
			for _, g := range targets[c.Kind].(*RetypeParams).GPUs {
				if strings.ContainsAny(g.PCI+g.To+g.From+g.ToTrait+g.FromTrait+g.ProviderUUID, "\n\r =") {
					t.Fatalf("retype params %+v accepted", g)
				}
			}
		}
		if _, err := json.Marshal(c); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}

func FuzzDecodeReport(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "report.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"v":1,"host":"h","gpus":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := DecodeReport(b); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("error %v does not wrap ErrInvalid", err)
		}
	})
}

// TestMinorVersions: a receiver reads its own minor and the one before,
// ignoring fields it does not know, and names which side to upgrade for
// any other.
func TestMinorVersions(t *testing.T) {
	bodies := map[string]struct {
		body   string
		decode func([]byte) error
	}{
		"command": {`{"v":1,"minor":M,"id":"c1","kind":"verify_vgpu","host":"h","expires_at":"2025-03-01T12:00:00Z","key_id":"","sig":"","later_field":{"x":1}}`,
			func(b []byte) error { _, err := DecodeCommand(b); return err }},
		"result": {`{"v":1,"minor":M,"command_id":"c1","host":"h","status":"succeeded","later_field":[1]}`,
			func(b []byte) error { _, err := DecodeResult(b); return err }},
		"report": {`{"v":1,"minor":M,"host":"h","gpus":[],"later_field":"x"}`,
			func(b []byte) error { _, err := DecodeReport(b); return err }},
	}
	tests := []struct {
		minor   string
		wantErr string // "" accepted
	}{
		{"0", ""},
		{"1", ""},
		{"2", "newer than this side's 1.1: upgrade this side"},
		{"-1", "older than this side accepts (1.0 and 1.1): upgrade the sender"},
	}
	for what, b := range bodies {
		for _, tt := range tests {
			t.Run(what+"/"+tt.minor, func(t *testing.T) {
				err := b.decode([]byte(strings.Replace(b.body, "M", tt.minor, 1)))
				switch {
				case tt.wantErr == "" && err != nil:
					t.Errorf("minor %s refused: %v", tt.minor, err)
				case tt.wantErr != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr)):
					t.Errorf("minor %s: err = %v, want ErrInvalid saying %q", tt.minor, err, tt.wantErr)
				}
			})
		}
		// Without "minor" (agents before minor 1): minor 0.
		if err := b.decode([]byte(strings.Replace(b.body, `"minor":M,`, "", 1))); err != nil {
			t.Errorf("%s without minor refused: %v", what, err)
		}
	}
	if Minor != 1 || !AcceptedMinor(0) || AcceptedMinor(2) {
		t.Errorf("Minor = %d; a change of Minor must change this test and the protocol notes", Minor)
	}
}

// TestRetypeParamsValidate: retype_gpus takes 1 to 64 GPUs of PCI
// addresses, mdev type names and custom traits, and a nova.conf change.
func TestRetypeParamsValidate(t *testing.T) {
	ok := RetypeGPU{PCI: "0000:d8:00.0", From: "nvidia-232", To: "nvidia-222", ProviderUUID: "9e1c07f3-15a3-408a-931f-4b41599b1cc0",
		FromTrait: "CUSTOM_NVIDIA_232", ToTrait: "CUSTOM_NVIDIA_222"}
	conf := "[devices]\nenabled_mdev_types = nvidia-222\n"
	cases := []struct {
		name string
		p    RetypeParams
		ok   bool
	}{
		{"valid", RetypeParams{GPUs: []RetypeGPU{ok}, NovaConf: conf}, true},
		{"no GPU", RetypeParams{NovaConf: conf}, false},
		{"no conf", RetypeParams{GPUs: []RetypeGPU{ok}}, false},
		{"bad address", RetypeParams{GPUs: []RetypeGPU{{PCI: "d8:00", To: "nvidia-222", ToTrait: "CUSTOM_NVIDIA_222"}}, NovaConf: conf}, false},
		{"bad type", RetypeParams{GPUs: []RetypeGPU{{PCI: "0000:d8:00.0", To: "nvidia-222]\n[x", ToTrait: "CUSTOM_NVIDIA_222"}}, NovaConf: conf}, false},
		{"bad trait", RetypeParams{GPUs: []RetypeGPU{{PCI: "0000:d8:00.0", To: "nvidia-222", ToTrait: "HW_GPU"}}, NovaConf: conf}, false},
		{"bad provider", RetypeParams{GPUs: []RetypeGPU{{PCI: "0000:d8:00.0", To: "nvidia-222", ToTrait: "CUSTOM_NVIDIA_222",
			ProviderUUID: "x y"}}, NovaConf: conf}, false},
	}
	for _, c := range cases {
		if err := c.p.Validate(RetypeGPUs); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
