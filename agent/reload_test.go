package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// TestReloadFrom: a reload from a new configuration switches the signing
// key and key_id; one naming a missing key file keeps the key in use.
func TestReloadFrom(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	_, bridgePub, err := protocol.GenerateKey("bridge-1", "")
	if err != nil {
		t.Fatal(err)
	}
	ring := write("bridge-keys.pem", bridgePub, 0o644)
	privA, _, _ := protocol.GenerateKey("agent-a", "h")
	privB, _, _ := protocol.GenerateKey("agent-b", "h")
	keyA, keyB := write("a.key", privA, 0o600), write("b.key", privB, 0o600)
	load := func(key, id string) *conf.Values {
		t.Helper()
		v, err := LoadConfig(conf.Source{Overrides: []string{"security.bridge_keys_file=" + ring,
			"security.signing_key_file=" + key, "security.key_id=" + id}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	start := load(keyA, "agent-a")
	s, err := newSecurity(start, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	keyID := func() string {
		var r protocol.Result
		if err := s.SignResult(&r); err != nil {
			t.Fatal(err)
		}
		return r.KeyID
	}
	tests := []struct {
		name    string
		v       *conf.Values
		wantErr bool
		want    string
	}{
		{"new key and key id", load(keyB, "agent-b"), false, "agent-b"},
		{"missing key file keeps the key", load(filepath.Join(dir, "missing.key"), "agent-c"), true, "agent-b"},
		{"back to the first key", load(keyA, "agent-a"), false, "agent-a"},
	}
	for _, tc := range tests {
		err := s.ReloadFrom(tc.v, start)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v, want error %v", tc.name, err, tc.wantErr)
		}
		if got := keyID(); got != tc.want {
			t.Errorf("%s: results signed with %q, want %q", tc.name, got, tc.want)
		}
	}
}
