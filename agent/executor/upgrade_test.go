package executor

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// upgradeEnv is an executor whose driver_upgrade_command is script (a
// shell script written to a temp dir); "" leaves the option empty.
func upgradeEnv(t *testing.T, script string, timeout time.Duration) (*env, string) {
	t.Helper()
	en := newEnv(t)
	dir := t.TempDir()
	var argv []string
	if script != "" {
		p := filepath.Join(dir, "upgrade.sh")
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			t.Fatal(err)
		}
		argv = []string{p, dir}
	}
	j, err := journal.Open(filepath.Join(dir, "journal"), journal.Options{Now: func() time.Time { return en.now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	en.j = j
	e, err := New(Config{Host: host, Journal: j, Sysfs: en.h, Domains: en.h, UpgradeCommand: argv, UpgradeTimeout: timeout,
		Now: func() time.Time { return en.now }})
	if err != nil {
		t.Fatal(err)
	}
	en.e = e
	return en, dir
}

func upgradeCommand(t *testing.T, id string, p protocol.UpgradeParams) protocol.Command {
	c := command(t, id, protocol.UpgradeDriver, p)
	c.InstanceUUID = ""
	return c
}

func upgradeDetails(t *testing.T, r protocol.Result) protocol.UpgradeDetails {
	t.Helper()
	var d protocol.UpgradeDetails
	if err := json.Unmarshal(r.Details, &d); err != nil {
		t.Fatalf("details %s: %v", r.Details, err)
	}
	return d
}

func TestUpgradeDriver(t *testing.T) {
	for _, tc := range []struct {
		name       string
		script     string
		params     protocol.UpgradeParams
		timeout    time.Duration
		status     protocol.Status
		code       string
		exit       int
		output     string // substring of the kept output
		ranTimes   int    // how many times the script ran (it appends to $1/ran)
		truncated  bool
		notRunning bool
	}{
		{name: "succeeds with the target in its environment",
			script: "echo run >> \"$1/ran\"; echo \"installing $VGPU_TARGET_BRANCH/$VGPU_TARGET_VERSION\"; echo warn >&2\n",
			params: protocol.UpgradeParams{Branch: "570", Version: "570.133.10"}, status: protocol.Succeeded,
			output: "installing 570/570.133.10\nwarn", ranTimes: 1},
		{name: "non-zero exit fails with the output",
			script: "echo run >> \"$1/ran\"; echo 'dkms build failed'; exit 3\n",
			params: protocol.UpgradeParams{Branch: "570"}, status: protocol.Failed, code: protocol.CodeUpgradeFailed,
			exit: 3, output: "dkms build failed", ranTimes: 1},
		{name: "output is bounded to its tail",
			script: "echo run >> \"$1/ran\"; i=0; while [ $i -lt 5000 ]; do echo 'line of noise from the installer'; i=$((i+1)); done; echo LAST\n",
			params: protocol.UpgradeParams{Branch: "570"}, status: protocol.Succeeded, output: "LAST", ranTimes: 1, truncated: true},
		{name: "killed at the timeout",
			script:  "echo run >> \"$1/ran\"; sleep 30 & wait\n",
			timeout: 300 * time.Millisecond, params: protocol.UpgradeParams{Branch: "570"}, status: protocol.Failed,
			code: "timeout", exit: -1, ranTimes: 1},
		{name: "unconfigured agent refuses", params: protocol.UpgradeParams{Branch: "570"},
			status: protocol.Refused, code: protocol.CodeNotConfigured, notRunning: true},
		{name: "bad branch refused", script: "echo run >> \"$1/ran\"\n", params: protocol.UpgradeParams{Branch: "570 && reboot"},
			status: protocol.Refused, code: protocol.CodeInvalidCommand, notRunning: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			en, dir := upgradeEnv(t, tc.script, tc.timeout)
			c := upgradeCommand(t, "up-1", tc.params)
			r := en.exec(c)
			wantStatus(t, r, tc.status, tc.code)
			ran := func() int {
				b, _ := os.ReadFile(filepath.Join(dir, "ran"))
				return strings.Count(string(b), "run")
			}
			if tc.notRunning {
				if ran() != 0 {
					t.Fatal("the command ran")
				}
				if !strings.Contains(r.Message, "driver_upgrade_command") && tc.code == protocol.CodeNotConfigured {
					t.Errorf("message %q does not name the option", r.Message)
				}
				return
			}
			d := upgradeDetails(t, r)
			if d.ExitStatus != tc.exit || !strings.Contains(d.Output, tc.output) || d.Branch != tc.params.Branch {
				t.Errorf("details = exit %d branch %s output %q, want exit %d, output with %q", d.ExitStatus, d.Branch, d.Output, tc.exit, tc.output)
			}
			if tc.truncated != (d.Truncated > 0) || len(d.Output) > protocol.MaxUpgradeOutput {
				t.Errorf("truncated %d, output %d bytes", d.Truncated, len(d.Output))
			}
			// A repeated delivery answers the recorded result; the command does not run again.
			r2 := en.exec(c)
			if r2.Status != r.Status || !r2.FinishedAt.Equal(r.FinishedAt) || string(r2.Details) != string(r.Details) {
				t.Errorf("repeat answered %s %s, want the recorded %s %s", r2.Status, r2.FinishedAt, r.Status, r.FinishedAt)
			}
			if n := ran(); n != tc.ranTimes {
				t.Errorf("the command ran %d times, want %d", n, tc.ranTimes)
			}
		})
	}
}

func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{max: 4}
	for _, s := range []string{"ab", "cdef", "g"} {
		_, _ = b.Write([]byte(s))
	}
	if b.String() != "defg" || b.dropped != 3 {
		t.Errorf("got %q dropped %d", b.String(), b.dropped)
	}
}

// TestRetypeGPUs: retype_gpus runs gpu_retype_command with the nova.conf
// change on its standard input and in VGPU_NOVA_CONF, the GPUs and the
// traits in the environment; an agent without the option refuses it; a
// non-zero exit fails with the output.
func TestRetypeGPUs(t *testing.T) {
	p := protocol.RetypeParams{GPUs: []protocol.RetypeGPU{
		{PCI: "0000:3b:00.0", From: "nvidia-232", To: "nvidia-222", ProviderUUID: "9e1c07f3-15a3-408a-931f-4b41599b1cc0",
			FromTrait: "CUSTOM_NVIDIA_232", ToTrait: "CUSTOM_NVIDIA_222"},
		{PCI: "0000:d8:00.0", To: "nvidia-222", ProviderUUID: "0e1c07f3-15a3-408a-931f-4b41599b1cc0", ToTrait: "CUSTOM_NVIDIA_222"}},
		NovaConf: "[devices]\nenabled_mdev_types = nvidia-222\n\n[mdev_nvidia-222]\ndevice_addresses = 0000:3b:00.0,0000:d8:00.0\n"}
	for _, tc := range []struct {
		name, script string
		status       protocol.Status
		code         string
	}{
		{name: "succeeds", status: protocol.Succeeded,
			script: "cat > \"$1/stdin\"; printf '%s' \"$VGPU_NOVA_CONF\" > \"$1/env\"; printf '%s' \"$VGPU_RETYPE_GPUS\" > \"$1/gpus\"; " +
				"printf '%s' \"$VGPU_RETYPE_TRAITS\" > \"$1/traits\"; echo restarted nova-compute\n"},
		{name: "fails", script: "echo 'crudini: no such file'; exit 2\n", status: protocol.Failed, code: protocol.CodeUpgradeFailed},
		{name: "unconfigured agent refuses", status: protocol.Refused, code: protocol.CodeNotConfigured},
	} {
		t.Run(tc.name, func(t *testing.T) {
			en := newEnv(t)
			dir := t.TempDir()
			var argv []string
			if tc.script != "" {
				path := filepath.Join(dir, "retype.sh")
				if err := os.WriteFile(path, []byte("#!/bin/sh\n"+tc.script), 0o755); err != nil {
					t.Fatal(err)
				}
				argv = []string{path, dir}
			}
			j, err := journal.Open(filepath.Join(dir, "journal"), journal.Options{Now: func() time.Time { return en.now }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { j.Close() })
			en.j = j
			en.e, err = New(Config{Host: host, Journal: j, Sysfs: en.h, Domains: en.h, RetypeCommand: argv, UpgradeTimeout: time.Minute,
				Now: func() time.Time { return en.now }})
			if err != nil {
				t.Fatal(err)
			}
			c := command(t, "rt-1", protocol.RetypeGPUs, p)
			c.InstanceUUID = ""
			r := en.exec(c)
			wantStatus(t, r, tc.status, tc.code)
			switch tc.status {
			case protocol.Refused:
				if !strings.Contains(r.Message, "gpu_retype_command") {
					t.Errorf("message %q does not name the option", r.Message)
				}
				return
			case protocol.Failed:
				if d := upgradeDetails(t, r); d.ExitStatus != 2 || !strings.Contains(d.Output, "crudini") {
					t.Errorf("details %+v", d)
				}
				return
			}
			read := func(n string) string { b, _ := os.ReadFile(filepath.Join(dir, n)); return string(b) }
			if read("stdin") != p.NovaConf || read("env") != p.NovaConf ||
				read("gpus") != "0000:3b:00.0=nvidia-222\n0000:d8:00.0=nvidia-222" ||
				read("traits") != "9e1c07f3-15a3-408a-931f-4b41599b1cc0 CUSTOM_NVIDIA_232 CUSTOM_NVIDIA_222\n0e1c07f3-15a3-408a-931f-4b41599b1cc0 - CUSTOM_NVIDIA_222" {
				t.Errorf("the command got stdin %q, VGPU_NOVA_CONF %q, gpus %q, traits %q", read("stdin"), read("env"), read("gpus"), read("traits"))
			}
			if d := upgradeDetails(t, r); d.ExitStatus != 0 || !strings.Contains(d.Output, "restarted nova-compute") {
				t.Errorf("details %+v", d)
			}
		})
	}
}
