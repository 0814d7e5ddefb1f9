package bridge

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

type nopResults struct{}

func (nopResults) HandleResult(context.Context, protocol.Result) error { return nil }

func TestSecurityConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	priv, _, err := protocol.GenerateKey("bridge-a", "")
	if err != nil {
		t.Fatal(err)
	}
	_, pubA, _ := protocol.GenerateKey("agent-a", "host-a")
	_, pubB, _ := protocol.GenerateKey("agent-b", "host-b")
	keyFile := write("bridge.key", priv, 0o600)
	ringFile := write("agents.pem", pubA, 0o644)
	base := []string{"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/", "api.auth_strategy=noauth"}
	load := func(extra ...string) (*conf.Values, error) {
		return LoadConfig(conf.Source{Overrides: append(append([]string{}, base...), extra...)})
	}

	// Nothing set: the bridge does not run (signed by default), naming
	// both files and the opt-outs.
	v, err := load()
	if err != nil {
		t.Fatal(err)
	}
	var c dispatch.Config
	err = SecurityConfig(v, &c, nil)
	for _, want := range []string{"signing_key_file", "sign_commands = false", "agent_keys_file", "require_signed_results = false"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("defaults: %v; want an error naming %q", err, want)
		}
	}
	// Both opted out: nothing signed or verified.
	v, err = load("security.sign_commands=false", "security.require_signed_results=false")
	if err != nil {
		t.Fatal(err)
	}
	if err := SecurityConfig(v, &c, nil); err != nil || c.Signer != nil || c.Keyring != nil || c.RequireSigned {
		t.Fatalf("opted out: %v, %+v", err, c)
	}
	// The deprecated auto is true.
	v, err = load("security.sign_commands=false", "security.require_signed_results=auto")
	if err != nil {
		t.Fatal(err)
	}
	if err := SecurityConfig(v, &c, nil); err == nil || !strings.Contains(err.Error(), "agent_keys_file") {
		t.Errorf("require_signed_results = auto without a keyring: %v", err)
	}

	// Everything set; require_signed_results true by default.
	v, err = load("security.signing_key_file="+keyFile, "security.key_id=bridge-a", "security.agent_keys_file="+ringFile)
	if err != nil {
		t.Fatal(err)
	}
	c = dispatch.Config{}
	if err := SecurityConfig(v, &c, nil); err != nil {
		t.Fatal(err)
	}
	if c.Signer == nil || c.Signer.KeyID() != "bridge-a" || c.Keyring == nil || c.Keyring.Len() != 1 || !c.RequireSigned {
		t.Fatalf("mapped %+v", c)
	}

	// SIGHUP: the keyring is re-read; a broken one leaves the keys in use.
	pool, err := pgxpool.New(context.Background(), "postgres://u@127.0.0.1:1/db") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c.URLs = []string{"amqp://127.0.0.1:1/"}
	disp, err := dispatch.New(c, dispatch.Deps{Pool: pool, Results: nopResults{}})
	if err != nil {
		t.Fatal(err)
	}
	write("agents.pem", append(append([]byte{}, pubA...), pubB...), 0o644)
	if err := ReloadKeys(v, disp); err != nil {
		t.Fatal(err)
	}
	if k := disp.Keys(); k.Keyring.Len() != 2 || k.Signer != c.Signer || !k.RequireSigned {
		t.Fatalf("after reload: %+v", k)
	}
	write("agents.pem", []byte("not PEM"), 0o644)
	if err := ReloadKeys(v, disp); err == nil {
		t.Fatal("a broken keyring was accepted")
	}
	if disp.Keys().Keyring.Len() != 2 {
		t.Fatal("the keys in use changed after a refused reload")
	}

	// Errors.
	for _, tc := range []struct {
		opts []string
		want string
	}{
		{[]string{"security.signing_key_file=" + keyFile}, "go together"},
	} {
		if _, err := load(tc.opts...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.opts, err, tc.want)
		}
	}
	loose := write("loose.key", priv, 0o644)
	v, err = load("security.signing_key_file="+loose, "security.key_id=bridge-a", "security.require_signed_results=false")
	if err != nil {
		t.Fatal(err)
	}
	if err := SecurityConfig(v, &dispatch.Config{}, nil); err == nil || !strings.Contains(err.Error(), "signing_key_file") {
		t.Errorf("a world-readable key: %v", err)
	}
}
