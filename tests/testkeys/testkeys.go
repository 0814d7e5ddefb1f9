// Package testkeys gives a test the signed-by-default setup of the
// product: a bridge signing key and a keyring of agent keys, made with
// the same code as `vgpu-bridge keys init` and `keys enrol HOST`.
package testkeys

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keys"
)

// BridgeKeyID is the key id of every test's bridge key.
const BridgeKeyID = "test-bridge"

// Ring is one test's keys.
type Ring struct {
	t                     testing.TB
	dir                   string
	signingKey, agentKeys string
	signer                *protocol.Signer

	mu    sync.Mutex
	hosts map[string][]string // host → agent overrides
}

var (
	mu    sync.Mutex
	rings = map[testing.TB]*Ring{}
)

// New makes a bridge key and an empty keyring of agent keys in dir (for
// programs without a testing.TB: the benchmarks).
func New(dir string) (*Ring, error) {
	r := &Ring{dir: dir, signingKey: filepath.Join(dir, "bridge.key"), agentKeys: filepath.Join(dir, "agent-keys.pem"),
		hosts: map[string][]string{}}
	if _, err := (keys.Init{SigningKeyFile: r.signingKey, KeyID: BridgeKeyID, AgentKeysFile: r.agentKeys}).Run(); err != nil {
		return nil, fmt.Errorf("testkeys: keys init: %w", err)
	}
	s, err := protocol.LoadSigner(r.signingKey, BridgeKeyID)
	if err != nil {
		return nil, fmt.Errorf("testkeys: %w", err)
	}
	r.signer = s
	return r, nil
}

// For returns t's keys, made on first use: every harness of one test
// (bridge, agents) shares them.
func For(t testing.TB) *Ring {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if r := rings[t]; r != nil {
		return r
	}
	r, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r.t = t
	rings[t] = r
	t.Cleanup(func() {
		mu.Lock()
		delete(rings, t)
		mu.Unlock()
	})
	return r
}

// Bridge returns the bridge's [security] overrides.
func (r *Ring) Bridge() []string {
	return []string{"security.signing_key_file=" + r.signingKey, "security.key_id=" + BridgeKeyID,
		"security.agent_keys_file=" + r.agentKeys}
}

// AgentKeysFile is the bridge's [security] agent_keys_file.
func (r *Ring) AgentKeysFile() string { return r.agentKeys }

// Signer is the bridge's signing key.
func (r *Ring) Signer() *protocol.Signer { return r.signer }

// Agent enrolls host (once) and returns its agent's [security]
// overrides. The bridge reads the keyring again when the agent's first
// message names the new key, so the order of Agent and the bridge's
// start does not matter.
func (r *Ring) Agent(host string) []string {
	r.t.Helper()
	ov, err := r.Enrol(host)
	if err != nil {
		r.t.Fatal(err)
	}
	return ov
}

// Enrol is Agent with an error.
func (r *Ring) Enrol(host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ov, ok := r.hosts[host]; ok {
		return ov, nil
	}
	en, err := keys.Enrol{AgentKeysFile: r.agentKeys, Bridge: r.signer, Host: host}.Run()
	if err != nil {
		return nil, fmt.Errorf("testkeys: keys enrol %s: %w", host, err)
	}
	dir, err := os.MkdirTemp(r.dir, "host-")
	if err != nil {
		return nil, err
	}
	if _, err := en.WriteHostFiles(dir, dir); err != nil {
		return nil, fmt.Errorf("testkeys: %w", err)
	}
	ov := []string{"security.bridge_keys_file=" + filepath.Join(dir, "bridge-keys.pem"),
		"security.signing_key_file=" + filepath.Join(dir, "agent.key"), "security.key_id=" + en.KeyID}
	r.hosts[host] = ov
	return ov, nil
}

// Keyring reads the keyring of agent keys as it is now.
func (r *Ring) Keyring() (*protocol.Keyring, error) { return protocol.LoadKeyring(r.agentKeys) }

// Insecure options, for tests of something else that run a bridge or an
// agent without any keys: the explicit opt-outs.
var (
	InsecureBridge = []string{"security.sign_commands=false", "security.require_signed_results=false"}
	InsecureAgent  = []string{"security.require_signed_commands=false", "security.sign_results=false"}
)
