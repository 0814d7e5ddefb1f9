package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func TestSecurityOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		set  []string
		want string // "" loads
	}{
		"defaults":                  {nil, ""},
		"key file without key id":   {[]string{"security.signing_key_file=/k"}, "go together"},
		"key id without key file":   {[]string{"security.key_id=k1"}, "go together"},
		"client cert without key":   {[]string{"amqp.ssl_cert_file=/c"}, "go together"},
		"switch-over without keys ": {[]string{"security.require_signed_commands=false"}, ""},
	} {
		_, err := LoadConfig(conf.Source{Overrides: tc.set})
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// TestCheckSigning: serve needs the keys to verify commands and sign
// results and reports unless each is explicitly opted out of.
func TestCheckSigning(t *testing.T) {
	keys := []string{"security.bridge_keys_file=/etc/vgpu-bridge/bridge-keys.pem",
		"security.signing_key_file=/etc/vgpu-bridge/agent.key", "security.key_id=compute-1-a"}
	for name, tc := range map[string]struct {
		set  []string
		want []string // options named in the errors
	}{
		"defaults":             {nil, []string{"bridge_keys_file", "signing_key_file"}},
		"required, no keys":    {[]string{"security.require_signed_commands=true"}, []string{"bridge_keys_file", "signing_key_file"}},
		"auto is true":         {[]string{"security.require_signed_commands=auto", "security.sign_results=false"}, []string{"bridge_keys_file"}},
		"unsigned results":     {[]string{"security.require_signed_commands=false"}, []string{"signing_key_file"}},
		"both opted out":       {testOptOut, nil},
		"keys":                 {keys, nil},
		"keys, auto (default)": {append([]string{"security.require_signed_commands=auto"}, keys...), nil},
	} {
		v, err := LoadConfig(conf.Source{Overrides: tc.set})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got []string
		for _, e := range CheckSigning(v) {
			if !strings.Contains(e.Problem, "opt out with") {
				t.Errorf("%s: %v does not say how to opt out", name, e)
			}
			got = append(got, e.Option)
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: errors name %v, want %v", name, got, tc.want)
		}
	}
}

// testOptOut runs an agent without keys (tests of something else).
var testOptOut = []string{"security.require_signed_commands=false", "security.sign_results=false"}

func TestSecurityRequiredAndReload(t *testing.T) {
	dir := t.TempDir()
	ring := filepath.Join(dir, "keys.pem")
	_, pub, err := protocol.GenerateKey("bridge-1", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ring, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	load := func(set ...string) *security {
		v, err := LoadConfig(conf.Source{Overrides: append(set, "security.bridge_keys_file="+ring, "security.sign_results=false")})
		if err != nil {
			t.Fatal(err)
		}
		s, err := newSecurity(v, slog.New(slog.DiscardHandler), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	unsigned := []byte(`{"v":1,"id":"c1","kind":"verify_vgpu","host":"h","expires_at":"2099-01-01T00:00:00Z","key_id":"","sig":""}`)
	if err := load().VerifyCommand(unsigned); protocol.SignatureCode(err) != protocol.CodeBadSignature {
		t.Errorf("signed commands required: unsigned gave %v, want bad_signature", err)
	}
	s := load("security.require_signed_commands=false")
	if err := s.VerifyCommand(unsigned); err != nil {
		t.Errorf("switch-over: unsigned refused: %v", err)
	}
	// A bad file on reload keeps the keys in use.
	if err := os.WriteFile(ring, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil || s.ring.Load().Len() != 1 {
		t.Errorf("reload of a bad keyring: %v, keys %d", err, s.ring.Load().Len())
	}
	// An empty keyring while signatures are required refuses to load.
	if err := os.WriteFile(ring, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	v, _ := LoadConfig(conf.Source{Overrides: []string{"security.bridge_keys_file=" + ring, "security.sign_results=false"}})
	if _, err := newSecurity(v, slog.New(slog.DiscardHandler), nil, nil); err == nil {
		t.Error("empty keyring accepted while signed commands are required")
	}
}
