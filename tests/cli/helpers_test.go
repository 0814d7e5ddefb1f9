// Package cli tests the vgpuctl binary end to end: it is built once and
// run as a process against a real bridge (bridge.Run on the real Postgres
// and RabbitMQ, token auth, a [webhook_source:lab] with an HMAC secret),
// and against the real placement and policy handlers on an API server of
// their own where bridge.Run does not serve them. Table output is compared
// with golden files in testdata (go test ./tests/cli -update rewrites
// them); JSON and YAML output and every exit code are checked.
package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// binPath is the vgpuctl binary TestMain built.
var binPath string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "vgpuctl-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "vgpuctl")
	build := exec.Command(goTool(), "build", "-o", binPath, "github.com/vgpu-bridge/vgpu-bridge/cmd/vgpuctl")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build vgpuctl:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// ctl runs vgpuctl against one API with one token.
type ctl struct {
	url, token string
	env        []string // extra NAME=value
}

type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// run runs the binary with args; stdin, when given, is its standard input.
func (c ctl) run(t *testing.T, args ...string) result {
	t.Helper()
	return c.runIn(t, nil, args...)
}

func (c ctl) runIn(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VGPUCTL_") && !strings.HasPrefix(kv, "OS_") {
			env = append(env, kv)
		}
	}
	env = append(env, "VGPUCTL_URL="+c.url)
	if c.token != "" {
		env = append(env, "VGPUCTL_TOKEN="+c.token)
	}
	cmd.Env = append(env, c.env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("run vgpuctl %v: %v", args, err)
	}
	return r
}

// must runs args and fails the test unless the exit code is want.
func (c ctl) must(t *testing.T, want int, args ...string) result {
	t.Helper()
	r := c.run(t, args...)
	if r.code != want {
		t.Fatalf("vgpuctl %s: want exit %d, got %s", strings.Join(args, " "), want, r)
	}
	return r
}

// golden compares got with testdata/NAME.golden, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./tests/cli -run %s -update to create it)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("%s differs from %s (-update rewrites it)\n--- got\n%s--- want\n%s", name, path, got, want)
	}
}

// reNow matches table times that are not the fixed test times of 2024
// (row creation times set by the database).
var reNow = regexp.MustCompile(`\b20(2[5-9]|[3-9]\d)-\d\d-\d\dT\d\d:\d\d:\d\dZ\b`)

// mask replaces run-dependent values with placeholders of the same width,
// so the table columns stay aligned: times set by the database, and each
// given value by its label.
func mask(s string, values map[string]string) string {
	s = reNow.ReplaceAllString(s, "YYYY-MM-DDThh:mm:ssZ")
	keys := make([]string, 0, len(values))
	for v := range values {
		keys = append(keys, v)
	}
	// Longest first: a value may contain another (a node in a provider name).
	sort.Slice(keys, func(i, j int) bool {
		return len(keys[i]) > len(keys[j]) || len(keys[i]) == len(keys[j]) && keys[i] < keys[j]
	})
	for _, v := range keys {
		label := values[v]
		if v == "" {
			continue
		}
		p := "<" + label + ">"
		if len(p) < len(v) {
			p = "<" + label + strings.Repeat("-", len(v)-len(p)) + ">"
		}
		s = strings.ReplaceAll(s, v, p)
	}
	return s
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func abs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	testsvc.WaitFor(t, within, what, cond)
}
