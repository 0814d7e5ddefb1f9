package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := runCmd(t, "version")
	if code != 0 || !strings.HasPrefix(out, "vgpu-bridge ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version = %d %q", code, out)
	}
}

func TestBadConfigurationExits2WithEveryProblem(t *testing.T) {
	t.Setenv("VGPU_BRIDGE_DATABASE_MAX_CONNECTIONS", "lots")
	code, _, errOut := runCmd(t, "serve", "--config", "", "--set", "api.auth_strategy=magic",
		"--set", "DEFAULT.transport_url=kafka://x/")
	if code != 2 {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, errOut)
	}
	for _, want := range []string{
		`[DEFAULT] transport_url = "***": transport URL scheme "kafka" is not supported`,
		`[api] auth_strategy = "magic": not one of the choices; allowed: noauth, token`,
		`[database] max_connections = "lots": not an integer`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

func TestUnknownFlagExits2(t *testing.T) {
	if code, _, _ := runCmd(t, "serve", "--no-such-flag"); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
}

func TestMigrateUpTwice(t *testing.T) {
	db := testsvc.Postgres(t)
	args := []string{"--config", "", "--set", "database.connection=" + db, "--set", "DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:5672/",
		"--set", "api.auth_strategy=noauth", "--set", "DEFAULT.log_format=text"}
	code, out, errOut := runCmd(t, append([]string{"migrate", "up"}, args...)...)
	if code != 0 || !strings.Contains(out, "applied ") {
		t.Fatalf("first migrate up = %d %q %s", code, out, errOut)
	}
	code, out, _ = runCmd(t, append([]string{"migrate", "up"}, args...)...)
	if code != 0 || !strings.Contains(out, "nothing to apply") {
		t.Fatalf("second migrate up = %d %q", code, out)
	}
	code, out, _ = runCmd(t, append([]string{"migrate", "status"}, args...)...)
	if code != 0 || strings.Contains(out, "pending") || !strings.Contains(out, "00001_init.sql") {
		t.Fatalf("migrate status = %d %q", code, out)
	}
}
