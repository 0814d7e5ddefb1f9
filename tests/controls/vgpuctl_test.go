package controls_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// vgpuctlBin is the vgpuctl binary, built once per test process.
func vgpuctlBin(t *testing.T) string { return testsvc.Binary(t, "vgpuctl") }

type ctlResult struct {
	code           int
	stdout, stderr string
}

// vgpuctl runs the binary against the fleet's bridge with token.
func (f *fleet) vgpuctl(token string, args ...string) ctlResult {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, vgpuctlBin(f.t), args...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VGPUCTL_") && !strings.HasPrefix(kv, "OS_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "VGPUCTL_URL="+f.url, "VGPUCTL_TOKEN="+token)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := ctlResult{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		f.t.Fatalf("run vgpuctl %v: %v", args, err)
	}
	return r
}

// TestVgpuctl drives the controls through the vgpuctl binary and checks
// its output and exit codes (0 ok, 1 the API refused, 2 usage).
func TestVgpuctl(t *testing.T) {
	f := newFleet(t)
	f.start()
	a := f.hosts[0]
	gl, err := f.admin.GPUs(f.ctx, apiclient.GPUFilter{Host: a.node})
	if err != nil || len(gl.GPUs) != 2 {
		t.Fatalf("GPUs of %s: %v %s", a.node, err, gl.Raw)
	}
	gpu := gl.GPUs[0].ProviderUUID
	admin, reader := testbridge.AdminToken, testbridge.ReaderToken
	tests := []struct {
		name  string
		token string
		args  []string
		code  int
		out   []string // substrings of stdout (stderr when code != 0)
	}{
		{"show", reader, []string{"controls"}, 0, []string{"Paused", "no"}},
		{"pause needs a reason", admin, []string{"pause"}, 2, []string{"reason"}},
		{"reader may not pause", reader, []string{"pause", "--reason", "x"}, 1, []string{"Forbidden"}},
		{"pause", admin, []string{"pause", "--reason", "CHG-1"}, 0, []string{"Paused", "yes", "CHG-1", "ops"}},
		{"resume", admin, []string{"resume", "--reason", "done", "-o", "json"}, 0, []string{`"paused": false`, `"changed": true`}},
		{"observe-only bad arg", admin, []string{"observe-only", "maybe", "--reason", "x"}, 2, []string{"maybe"}},
		{"observe-only on", admin, []string{"observe-only", "on", "--reason", "trial"}, 0, []string{"Observe-only", "yes"}},
		{"observe-only off", admin, []string{"observe-only", "off", "--reason", "trial over"}, 0, []string{"Observe-only", "no"}},
		{"drain what", admin, []string{"drain", "rack", "x", "--reason", "r"}, 2, []string{"host or gpu"}},
		{"drain needs a reason", admin, []string{"drain", "host", a.node}, 2, []string{"--reason"}},
		// No agent reported the host and Nova sent nothing: the Placement
		// mirror knows its node.
		{"drain host", admin, []string{"drain", "host", a.node, "--reason", "kernel upgrade", "-o", "json"}, 0,
			[]string{`"drained": true`, `"drain_reason": "kernel upgrade"`}},
		{"hosts show the drain", reader, []string{"hosts", "-o", "json"}, 0, []string{`"drain_reason": "kernel upgrade"`}},
		{"undrain host", admin, []string{"undrain", "host", a.node}, 0, []string{"Drained", "no"}},
		{"drain unknown host", admin, []string{"drain", "host", "no-such-host", "--reason", "r"}, 1, []string{"Host not found"}},
		{"drain gpu", admin, []string{"drain", "gpu", gpu, "--reason", "fan"}, 0, []string{gpu, "yes", "fan"}},
		{"undrain gpu", admin, []string{"undrain", "gpu", gpu, "--reason", "fan replaced"}, 0, []string{gpu, "no"}},
		{"audit", reader, []string{"audit", "--action", "host.*"}, 0, []string{"host.drain", "host.undrain", "host/" + a.node, "ops"}},
		{"profiles", reader, []string{"profiles", "--series", "Q", "--gpu", "T4"}, 0, []string{"T4-4Q", "nvidia-232", t4q4Trait}},
		{"replay bad id", admin, []string{"dead-letters", "replay", "abc"}, 2, []string{"dead letter id"}},
		{"replay unknown", admin, []string{"dead-letters", "replay", "999999999"}, 1, []string{"Dead letter not found"}},
	}
	for _, tt := range tests {
		r := f.vgpuctl(tt.token, tt.args...)
		got := r.stdout
		if tt.code != 0 {
			got = r.stderr
		}
		if r.code != tt.code {
			t.Errorf("%s: vgpuctl %v exit %d, want %d\nstdout: %s\nstderr: %s", tt.name, tt.args, r.code, tt.code, r.stdout, r.stderr)
			continue
		}
		for _, want := range tt.out {
			if !strings.Contains(got, want) {
				t.Errorf("%s: vgpuctl %v output lacks %q:\n%s", tt.name, tt.args, want, got)
			}
		}
	}
	// -o json of audit is the API's answer.
	r := f.vgpuctl(reader, "audit", "--action", "controls.set", "-o", "json")
	var al struct {
		Audit []struct {
			Action string `json:"action"`
		} `json:"audit"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &al); err != nil || len(al.Audit) != 4 {
		t.Errorf("audit -o json: %v, %d rows (want 4 controls.set)\n%s", err, len(al.Audit), r.stdout)
	}
}
