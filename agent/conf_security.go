package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// [security]: signed commands, results and reports (agent/protocol/sign.go).
var (
	optRequireSigned = securityOptions.Choice("security", "require_signed_commands", "true", []string{"true", "false", "auto"},
		"Whether a command without a signature is refused (code bad_signature). true (the default) needs "+
			"bridge_keys_file. false is an explicit opt-out for a lab or a switch-over: signed commands are still "+
			"verified when bridge_keys_file is set (a bad signature, unknown key or expired key is refused) but "+
			"unsigned ones run, each logged and counted in vgpu_agent_commands_unsigned_total. auto (deprecated, "+
			"the former default) is the same as true. Example: true")
	optSignResults = securityOptions.Bool("security", "sign_results", true,
		"Whether results and reports are signed. true (the default) needs signing_key_file and key_id "+
			"(vgpu-bridge keys enrol HOST on the bridge's host writes them). false is an explicit opt-out: they go "+
			"unsigned, which a bridge that requires signed results drops. Example: true")
	optBridgeKeysFile = securityOptions.String("security", "bridge_keys_file", "",
		"The bridge's public keys this agent trusts for commands: PEM \"PUBLIC KEY\" blocks (openssl pkey -pubout), "+
			"each with a \"Key-Id:\" header and, for a key being rotated out, \"Not-After: <RFC 3339 time>\" (end of its "+
			"grace period). Several keys may be trusted at once. Re-read on SIGHUP. Must not be world-writable. "+
			"Example: /etc/vgpu-bridge/bridge-keys.pem")
	optSigningKeyFile = securityOptions.String("security", "signing_key_file", "",
		"This host's private key, which signs the results and reports it sends: PEM PKCS#8 Ed25519 "+
			"(openssl genpkey -algorithm ed25519). The bridge trusts its public key with \"Host: <this host>\". "+
			"Mode 0600 or 0640. Re-read on SIGHUP. Required unless sign_results = false. "+
			"Example: /etc/vgpu-bridge/agent.key")
	optKeyID = securityOptions.String("security", "key_id", "",
		"The key id of signing_key_file, carried in key_id of every result and report; it must match the Key-Id of "+
			"the entry in the bridge's keyring. Change it with the key: SIGHUP reads both again. Example: compute-0012-2025a")
)

// securityOptions are the options declared in this file; Options assembles them
// into the daemon's set with checkSecurity.
var securityOptions = conf.NewGroup().
	SectionHelp("security", "Signed commands (verified with the bridge's keys) and signed results and reports (this host's key).")

// checkSecurity tests relations between the options of this file.
func checkSecurity(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if (optSigningKeyFile.Get(v) == "") != (optKeyID.Get(v) == "") {
		errs = append(errs, &conf.Error{Section: "security", Option: "key_id", Value: optKeyID.Get(v),
			Problem: "signing_key_file and key_id go together"})
	}
	return errs
}

// CheckSigning reports what the agent lacks to verify commands and sign
// its results and reports, the default: serve stops on it (exit 2), and
// so does RunWith. The local commands (inventory, diagnose) do not need
// the keys.
func CheckSigning(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if requireSigned(v) && optBridgeKeysFile.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "security", Option: "bridge_keys_file",
			Problem: "commands must be signed by default: set bridge_keys_file to the bridge's public key " +
				"(vgpu-bridge keys enrol HOST writes it), or opt out with require_signed_commands = false"})
	}
	if optSignResults.Get(v) && optSigningKeyFile.Get(v) == "" && optKeyID.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "security", Option: "signing_key_file",
			Problem: "results and reports are signed by default: set signing_key_file and key_id " +
				"(vgpu-bridge keys enrol HOST writes them), or opt out with sign_results = false"})
	}
	return errs
}

// requireSigned is require_signed_commands with the deprecated auto read
// as true.
func requireSigned(v *conf.Values) bool { return optRequireSigned.Get(v) != "false" }

// security verifies commands and signs results and reports with keys that
// Reload re-reads (SIGHUP) without a restart. It implements
// transport.Verifier and transport.Signer.
type security struct {
	required          bool
	keysFile, keyFile string
	keyID             string
	now               func() time.Time
	log               *slog.Logger

	mu     sync.Mutex // serializes Reload
	ring   atomic.Pointer[protocol.Keyring]
	signer atomic.Pointer[protocol.Signer]

	unsigned prometheus.Counter
	reloads  *prometheus.CounterVec
	keys     prometheus.Gauge
}

var (
	_ transport.Verifier = (*security)(nil)
	_ transport.Signer   = (*security)(nil)
)

// newSecurity reads the key files; an error stops the agent.
func newSecurity(v *conf.Values, log *slog.Logger, reg prometheus.Registerer, now func() time.Time) (*security, error) {
	if errs := CheckSigning(v); len(errs) > 0 {
		return nil, errs
	}
	if now == nil {
		now = time.Now
	}
	s := &security{keysFile: optBridgeKeysFile.Get(v), keyID: optKeyID.Get(v), required: requireSigned(v),
		now: now, log: log,
		unsigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_agent_commands_unsigned_total",
			Help: "Unsigned commands accepted because [security] require_signed_commands = false (switch-over only)."}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_agent_key_reloads_total",
			Help: "Reloads of the key files on SIGHUP, by outcome (ok, failed: the previous keys stay)."}, []string{"outcome"}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vgpu_agent_trusted_bridge_keys",
			Help: "Bridge keys in [security] bridge_keys_file (loaded)."}),
	}
	if optSignResults.Get(v) {
		s.keyFile = optSigningKeyFile.Get(v)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{s.unsigned, s.reloads, s.keys} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	if !s.required {
		log.Warn("INSECURE: unsigned commands run ([security] require_signed_commands = false)")
	}
	if s.keyFile == "" {
		log.Warn("INSECURE: results and reports go unsigned ([security] sign_results = false)")
	}
	return s, nil
}

// load reads both files and installs them only when both are good.
func (s *security) load() error {
	var ring *protocol.Keyring
	var signer *protocol.Signer
	var err error
	if s.keysFile != "" {
		if ring, err = protocol.LoadKeyring(s.keysFile); err != nil {
			return fmt.Errorf("[security] bridge_keys_file: %w", err)
		}
		if ring.Len() == 0 && s.required {
			return errors.New("[security] bridge_keys_file holds no key: every command would be refused")
		}
	}
	if s.keyFile != "" {
		if signer, err = protocol.LoadSigner(s.keyFile, s.keyID); err != nil {
			return fmt.Errorf("[security] signing_key_file: %w", err)
		}
	}
	s.ring.Store(ring)
	s.signer.Store(signer)
	if ring != nil {
		s.keys.Set(float64(ring.Len()))
	}
	return nil
}

// Reload re-reads the key files; on error the keys in use stay.
func (s *security) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.load(); err != nil {
		s.reloads.WithLabelValues("failed").Inc()
		s.log.Error("key reload failed; keeping the keys in use", logkey.Err, err)
		return err
	}
	s.reloads.WithLabelValues("ok").Inc()
	attrs := []any{}
	if r := s.ring.Load(); r != nil {
		ids := []string{}
		for _, k := range r.Keys() {
			ids = append(ids, k.ID)
		}
		attrs = append(attrs, "bridge_keys", ids)
	}
	if sg := s.signer.Load(); sg != nil {
		attrs = append(attrs, "key_id", sg.KeyID())
	}
	s.log.Info("keys reloaded", attrs...)
	return nil
}

// VerifyCommand implements transport.Verifier.
func (s *security) VerifyCommand(body []byte) error {
	ring := s.ring.Load()
	if ring == nil {
		return nil // no keys configured (and so not required)
	}
	_, err := ring.Verify(protocol.TypeCommand, body, s.now())
	if err != nil && !s.required && protocol.IsUnsigned(err) {
		s.unsigned.Inc()
		s.log.Warn("accepting an unsigned command ([security] require_signed_commands = false)")
		return nil
	}
	return err
}

// SignResult implements transport.Signer.
func (s *security) SignResult(r *protocol.Result) error {
	if sg := s.signer.Load(); sg != nil {
		return sg.SignResult(r)
	}
	return nil
}

// SignReport implements transport.Signer.
func (s *security) SignReport(r *protocol.Report) error {
	if sg := s.signer.Load(); sg != nil {
		return sg.SignReport(r)
	}
	return nil
}
