package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
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
	// --version says the same, as OpenStack services' commands do.
	if code, flag, _ := runCmd(t, "--version"); code != 0 || flag != out {
		t.Errorf("--version = %d %q, want %q", code, flag, out)
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

// TestServeUnsignedExits2: serve signs commands and verifies results and
// reports by default; without the keys it does not start, saying how to
// make them or to opt out.
func TestServeUnsignedExits2(t *testing.T) {
	code, _, errOut := runCmd(t, "serve", "--config", "", "--set", "database.connection=postgres://x@127.0.0.1:1/x",
		"--set", "DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:1/", "--set", "api.auth_strategy=noauth")
	if code != 2 {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, errOut)
	}
	for _, want := range []string{
		`[security] signing_key_file = "": commands are signed by default: set signing_key_file and key_id (vgpu-bridge keys init`,
		`or opt out with sign_commands = false`,
		`[security] agent_keys_file = "": results and reports must be signed by default`,
		`or opt out with require_signed_results = false`,
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
		"--set", "api.auth_strategy=noauth", "--set", "DEFAULT.log_format=text",
		"--set", "security.sign_commands=false", "--set", "security.require_signed_results=false"}
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

// TestKeysInitAndEnrol: keys init makes the bridge's key and an empty
// keyring; keys enrol HOST issues a host's pair, adds its public key with
// "Host: HOST" and writes the host's files, and the results it signs
// verify with the keyring; a second enrolment needs --rotate, which
// keeps the former key trusted until its Not-After.
func TestKeysInitAndEnrol(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--config", "", "--set", "database.connection=postgres://x@127.0.0.1/x",
		"--set", "DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:5672/", "--set", "api.auth_strategy=noauth",
		"--set", "security.signing_key_file=" + filepath.Join(dir, "bridge.key"), "--set", "security.key_id=bridge-2026a",
		"--set", "security.agent_keys_file=" + filepath.Join(dir, "agent-keys.pem")}
	code, out, errOut := runCmd(t, append([]string{"keys", "init"}, args...)...)
	if code != 0 || !strings.Contains(out, "BEGIN PUBLIC KEY") {
		t.Fatalf("keys init = %d %q %s", code, out, errOut)
	}
	if st, err := os.Stat(filepath.Join(dir, "bridge.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("bridge.key: %v %v", st, err)
	}
	if code, _, errOut = runCmd(t, append([]string{"keys", "init"}, args...)...); code == 0 || !strings.Contains(errOut, "exists") {
		t.Fatalf("a second keys init overwrote the key: %d %s", code, errOut)
	}

	hostDir := filepath.Join(dir, "compute-7")
	code, out, errOut = runCmd(t, append([]string{"keys", "enrol", "compute-7", "--out", hostDir, "--key-id", "compute-7-a"}, args...)...)
	if code != 0 || !strings.Contains(out, "host compute-7 enrolled with key compute-7-a") {
		t.Fatalf("keys enrol = %d %q %s", code, out, errOut)
	}
	conf, err := os.ReadFile(filepath.Join(hostDir, "agent-security.conf"))
	if err != nil || !strings.Contains(string(conf), "key_id = compute-7-a") || !strings.Contains(string(conf), "bridge_keys_file = /etc/vgpu-bridge/bridge-keys.pem") {
		t.Fatalf("agent-security.conf: %v\n%s", err, conf)
	}
	// What the host signs verifies with the bridge's keyring; what the
	// bridge signs verifies with the host's bridge-keys.pem.
	agentKey, err := protocol.LoadSigner(filepath.Join(hostDir, "agent.key"), "compute-7-a")
	testsvc.Must(t, err, "agent.key")
	r := protocol.Report{V: 1, Host: "compute-7", SentAt: time.Now().UTC()}
	testsvc.Must(t, agentKey.SignReport(&r), "sign")
	body, _ := json.Marshal(r)
	ring, err := protocol.LoadKeyring(filepath.Join(dir, "agent-keys.pem"))
	testsvc.Must(t, err, "keyring")
	if k, err := ring.Verify(protocol.TypeReport, body, time.Now()); err != nil || k.Host != "compute-7" {
		t.Fatalf("the enrolled key does not verify the host's report: %v %+v", err, k)
	}
	bridgeKey, err := protocol.LoadSigner(filepath.Join(dir, "bridge.key"), "bridge-2026a")
	testsvc.Must(t, err, "bridge.key")
	c := protocol.Command{V: 1, ID: "c1", Kind: protocol.CollectDiagnostics, Host: "compute-7", IssuedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Minute).UTC()}
	testsvc.Must(t, bridgeKey.SignCommand(&c), "sign command")
	body, _ = json.Marshal(c)
	hostRing, err := protocol.LoadKeyring(filepath.Join(hostDir, "bridge-keys.pem"))
	testsvc.Must(t, err, "bridge-keys.pem")
	if _, err := hostRing.Verify(protocol.TypeCommand, body, time.Now()); err != nil {
		t.Fatalf("the host's bridge-keys.pem does not verify the bridge's command: %v", err)
	}

	// Again: refused without --rotate; with it, both keys are trusted and
	// the former one only until its Not-After.
	code, _, errOut = runCmd(t, append([]string{"keys", "enrol", "compute-7", "--out", filepath.Join(dir, "again")}, args...)...)
	if code == 0 || !strings.Contains(errOut, "already has key compute-7-a") {
		t.Fatalf("a second enrolment without --rotate = %d %s", code, errOut)
	}
	code, out, errOut = runCmd(t, append([]string{"keys", "enrol", "compute-7", "--rotate", "--grace", "1h", "--out", filepath.Join(dir, "rotated")}, args...)...)
	if code != 0 || !strings.Contains(out, "former key compute-7-a stays trusted until") {
		t.Fatalf("keys enrol --rotate = %d %q %s", code, out, errOut)
	}
	ring, err = protocol.LoadKeyring(filepath.Join(dir, "agent-keys.pem"))
	testsvc.Must(t, err, "keyring")
	keys := ring.Keys()
	if len(keys) != 2 {
		t.Fatalf("keyring after rotation: %+v", keys)
	}
	for _, k := range keys {
		retired := k.ID == "compute-7-a"
		if k.Host != "compute-7" || retired == k.NotAfter.IsZero() || (retired && time.Until(k.NotAfter) > time.Hour) {
			t.Errorf("key %s: host %s, not after %v", k.ID, k.Host, k.NotAfter)
		}
	}
}
