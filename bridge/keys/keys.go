// Package keys issues the bridge's signing key and enrolls compute hosts
// in the keyring of agent keys: what `vgpu-bridge keys init` and
// `vgpu-bridge keys enrol HOST` do. The key formats are those of
// agent/protocol (sign.go).
package keys

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// Init creates the bridge's signing key and an empty keyring of agent
// keys. It never overwrites a key: a signing key that exists is an
// error, a keyring that exists is kept.
type Init struct {
	SigningKeyFile string // [security] signing_key_file
	KeyID          string // [security] key_id
	AgentKeysFile  string // [security] agent_keys_file
}

// Run creates the files and returns the bridge's public key as a keyring
// entry (what agents put in their bridge_keys_file).
func (in Init) Run() (public []byte, err error) {
	if in.SigningKeyFile == "" || in.KeyID == "" || in.AgentKeysFile == "" {
		return nil, errors.New("[security] signing_key_file, key_id and agent_keys_file must all be set")
	}
	private, public, err := protocol.GenerateKey(in.KeyID, "")
	if err != nil {
		return nil, err
	}
	if err := writeNew(in.SigningKeyFile, private, 0o600); err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if err := writeNew(in.AgentKeysFile, nil, 0o644); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("agent keys file: %w", err)
	}
	return public, nil
}

// Enrol issues a host's key pair and adds its public key to the keyring
// of agent keys, with Host set to the host, in one step.
type Enrol struct {
	AgentKeysFile string           // [security] agent_keys_file of the bridge
	Bridge        *protocol.Signer // the bridge's signing key: its public half goes to the host
	Host          string           // the agent's [DEFAULT] host
	KeyID         string           // default: HOST-YYYYMMDD-xxxxxx
	// Rotate lets a host that has a trusted key get a new one: its
	// current keys stay trusted until Now()+Grace (their Not-After).
	// Without it, enrolling a host that has a key is an error.
	Rotate bool
	Grace  time.Duration
	Now    func() time.Time
}

// Enrolment is what the host needs: its private key and the bridge's
// public key.
type Enrolment struct {
	Host, KeyID string
	PrivateKey  []byte   // the agent's signing_key_file (PEM PKCS#8, mode 0600)
	BridgeKeys  []byte   // the agent's bridge_keys_file (the bridge's public key)
	Retired     []string // key ids of the host's former keys, trusted until NotAfter
	NotAfter    time.Time
}

// Run generates the key pair and rewrites the keyring (atomically, under
// a lock, so that two enrolments at once both land).
func (e Enrol) Run() (*Enrolment, error) {
	if e.AgentKeysFile == "" {
		return nil, errors.New("[security] agent_keys_file is not set")
	}
	if e.Bridge == nil {
		return nil, errors.New("the bridge's signing key is not set ([security] signing_key_file)")
	}
	if e.Host == "" || strings.ContainsFunc(e.Host, func(r rune) bool { return r <= ' ' || r == 0x7f || r == ':' }) {
		return nil, fmt.Errorf("host %q must be a host name as the agent's [DEFAULT] host gives it", e.Host)
	}
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	if e.Grace <= 0 {
		e.Grace = 24 * time.Hour
	}
	if e.KeyID == "" {
		var b [3]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		e.KeyID = e.Host + "-" + now().UTC().Format("20060102") + "-" + hex.EncodeToString(b[:])
	}
	unlock, err := lock(e.AgentKeysFile + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()

	data, err := os.ReadFile(e.AgentKeysFile)
	if err != nil {
		return nil, fmt.Errorf("agent keys file (vgpu-bridge keys init creates it): %w", err)
	}
	ring, err := protocol.ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.AgentKeysFile, err)
	}
	if ring.Has(e.KeyID) {
		return nil, fmt.Errorf("key id %s is already in %s", e.KeyID, e.AgentKeysFile)
	}
	out := &Enrolment{Host: e.Host, KeyID: e.KeyID}
	var current []string
	for _, k := range ring.Keys() {
		if k.Host == e.Host && (k.NotAfter.IsZero() || k.NotAfter.After(now())) {
			current = append(current, k.ID)
		}
	}
	var keyring bytes.Buffer
	switch {
	case len(current) > 0 && !e.Rotate:
		return nil, fmt.Errorf("host %s already has key %s in %s: --rotate issues a new one and keeps the old "+
			"trusted for the grace period", e.Host, strings.Join(current, ", "), e.AgentKeysFile)
	case len(current) > 0:
		out.NotAfter = now().Add(e.Grace).UTC().Truncate(time.Second)
		for _, k := range ring.Keys() {
			if k.Host == e.Host && (k.NotAfter.IsZero() || k.NotAfter.After(out.NotAfter)) {
				k.NotAfter = out.NotAfter
				out.Retired = append(out.Retired, k.ID)
			}
			b, err := protocol.MarshalTrustedKey(k)
			if err != nil {
				return nil, err
			}
			keyring.Write(b)
		}
	default:
		keyring.Write(data) // append: what the operator wrote stays as it is
		if len(data) > 0 && data[len(data)-1] != '\n' {
			keyring.WriteByte('\n')
		}
	}
	private, public, err := protocol.GenerateKey(e.KeyID, e.Host)
	if err != nil {
		return nil, err
	}
	keyring.Write(public)
	if _, err := protocol.ParseKeyring(keyring.Bytes()); err != nil { // never write a keyring the bridge would refuse
		return nil, fmt.Errorf("new keyring: %w", err)
	}
	if err := replace(e.AgentKeysFile, keyring.Bytes()); err != nil {
		return nil, err
	}
	out.PrivateKey = private
	if out.BridgeKeys, err = protocol.MarshalTrustedKey(protocol.TrustedKey{ID: e.Bridge.KeyID(), Key: e.Bridge.PublicKey()}); err != nil {
		return nil, err
	}
	return out, nil
}

// WriteHostFiles writes what Enrol issued into dir, to be copied to the
// host: agent.key (0600), bridge-keys.pem and agent-security.conf, the
// [security] section naming them at their places under etcDir.
func (e *Enrolment) WriteHostFiles(dir, etcDir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	snippet := fmt.Sprintf("# vgpu-agent configuration of %s: the [security] section (vgpu-bridge keys enrol).\n"+
		"[security]\nbridge_keys_file = %s\nsigning_key_file = %s\nkey_id = %s\n",
		e.Host, filepath.Join(etcDir, "bridge-keys.pem"), filepath.Join(etcDir, "agent.key"), e.KeyID)
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"agent.key", e.PrivateKey, 0o600},
		{"bridge-keys.pem", e.BridgeKeys, 0o644},
		{"agent-security.conf", []byte(snippet), 0o644},
	}
	var paths []string
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := writeNew(p, f.data, f.mode); err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// writeNew creates path with data; an existing file is fs.ErrExist.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// replace writes data to path through a temporary file and a rename, with
// path's mode, so that a reader never sees half a keyring.
func replace(path string, data []byte) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(st.Mode().Perm()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// lock takes an exclusive flock on path (created 0600).
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
