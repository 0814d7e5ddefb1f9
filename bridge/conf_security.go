package bridge

import (
	"fmt"
	"log/slog"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// [security]: the bridge signs its commands and verifies its agents'
// results and reports (agent/protocol/sign.go).
var (
	optSecuritySigningKeyFile = securityOptions.String("security", "signing_key_file", "",
		"The bridge's private key, which signs every command it sends: PEM PKCS#8 Ed25519 "+
			"(openssl genpkey -algorithm ed25519 -out bridge.key). Agents trust its public key "+
			"(openssl pkey -in bridge.key -pubout) in their [security] bridge_keys_file with a \"Key-Id:\" header equal to "+
			"key_id. Mode 0600 or 0640. Re-read with key_id on SIGHUP: put the new key (with a new key_id) in place once agents trust it, then SIGHUP every replica. Empty: commands go unsigned (agents with signed commands required refuse them). "+
			"Example: /etc/vgpu-bridge/bridge.key")
	optSecuritySignCommands = securityOptions.Bool("security", "sign_commands", true,
		"Whether commands must be signed. true (the default) needs signing_key_file and key_id (vgpu-bridge keys init "+
			"writes both). false is an explicit opt-out for a lab or a switch-over: commands go out unsigned, which "+
			"agents that require signed commands refuse; the bridge logs a warning at start. Example: true")
	optSecurityKeyID = securityOptions.String("security", "key_id", "",
		"The key id of signing_key_file, carried in key_id of every command; agents look the verification key up by it. "+
			"Change it with the key (rotation: agents trust the old and the new key for a while, the old one with a "+
			"\"Not-After:\" header). Example: bridge-2025a")
	optSecurityAgentKeysFile = securityOptions.String("security", "agent_keys_file", "",
		"The agents' public keys: PEM \"PUBLIC KEY\" blocks (openssl pkey -pubout), each with the headers \"Key-Id:\" "+
			"(the agent's [security] key_id), \"Host:\" (the host whose results and reports it may sign) and, for a key "+
			"being rotated out, \"Not-After: <RFC 3339 time>\". A result or report that does not verify with the key of its "+
			"host is dropped, logged and counted in vgpu_bridge_dispatch_invalid_messages_total. Re-read on SIGHUP. "+
			"Must not be world-writable. vgpu-bridge keys init creates it; vgpu-bridge keys enrol HOST adds a host's key. A "+
			"result or report naming a key id the file does not hold makes the bridge read the file again when it has "+
			"changed (at most once a second), so an enrolled host needs no SIGHUP. Required unless "+
			"require_signed_results = false. Example: /etc/vgpu-bridge/agent-keys.pem")
	optSecurityRequireSigned = securityOptions.Choice("security", "require_signed_results", "true", []string{"true", "false", "auto"},
		"Whether an unsigned result or report is dropped (reason unsigned). true (the default) needs agent_keys_file. "+
			"false is an explicit opt-out for a lab or a switch-over: signed messages are still verified when "+
			"agent_keys_file is set, unsigned ones are accepted, each logged and counted in "+
			"vgpu_bridge_dispatch_unsigned_accepted_total. auto (deprecated, the former default) is the same as true. "+
			"Example: true")
)

// securityOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateSecurity.
var securityOptions = conf.NewGroup().
	SectionHelp("security", "Signed commands (the bridge's key) and signed results and reports (the agents' keys).")

// validateSecurity tests relations between the options of this file.
func validateSecurity(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if (optSecuritySigningKeyFile.Get(v) == "") != (optSecurityKeyID.Get(v) == "") {
		errs = append(errs, &conf.Error{Section: "security", Option: "key_id", Value: optSecurityKeyID.Get(v),
			Problem: "signing_key_file and key_id go together"})
	}
	return errs
}

// CheckSigning reports what the daemon lacks to sign its commands and
// verify results and reports, the default: serve stops on it (exit 2),
// and so does SecurityConfig. The one-shot commands (migrate, policy
// check, keys init) do not need the keys.
func CheckSigning(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if optSecuritySignCommands.Get(v) && optSecuritySigningKeyFile.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "security", Option: "signing_key_file",
			Problem: "commands are signed by default: set signing_key_file and key_id (vgpu-bridge keys init writes " +
				"the key), or opt out with sign_commands = false"})
	}
	if requireSignedResults(v) && optSecurityAgentKeysFile.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "security", Option: "agent_keys_file",
			Problem: "results and reports must be signed by default: set agent_keys_file (vgpu-bridge keys init " +
				"creates it, keys enrol HOST adds each host), or opt out with require_signed_results = false"})
	}
	return errs
}

// requireSignedResults is require_signed_results with the deprecated
// auto read as true.
func requireSignedResults(v *conf.Values) bool { return optSecurityRequireSigned.Get(v) != "false" }

// SecurityConfig reads the [security] key files into c (Signer, Keyring,
// RequireSigned). An unreadable or malformed file is an error: the bridge
// does not start rather than run with less trust than configured.
func SecurityConfig(v *conf.Values, c *dispatch.Config, log *slog.Logger) error {
	if errs := CheckSigning(v); len(errs) > 0 {
		return errs
	}
	if f := optSecuritySigningKeyFile.Get(v); f != "" && optSecuritySignCommands.Get(v) {
		s, err := protocol.LoadSigner(f, optSecurityKeyID.Get(v))
		if err != nil {
			return fmt.Errorf("[security] signing_key_file: %w", err)
		}
		c.Signer = s
	} else if log != nil {
		log.Warn("INSECURE: commands go out unsigned ([security] sign_commands = false); agents that require signed commands refuse them")
	}
	if f := optSecurityAgentKeysFile.Get(v); f != "" {
		k, err := protocol.LoadKeyring(f)
		if err != nil {
			return fmt.Errorf("[security] agent_keys_file: %w", err)
		}
		c.Keyring, c.KeyringFile = k, f
	}
	c.RequireSigned = requireSignedResults(v)
	if !c.RequireSigned && log != nil {
		log.Warn("INSECURE: unsigned results and reports are accepted ([security] require_signed_results = false)")
	}
	return nil
}

// ReloadKeys re-reads [security] agent_keys_file (same path, new
// contents: an agent added, a key rotated) into disp; on error the keys in
// use stay. The signing key stays. A SIGHUP reloads both (reload.go).
func ReloadKeys(v *conf.Values, disp *dispatch.Dispatcher) error {
	k := disp.Keys()
	if f := optSecurityAgentKeysFile.Get(v); f != "" {
		ring, err := protocol.LoadKeyring(f)
		if err != nil {
			return fmt.Errorf("[security] agent_keys_file: %w", err)
		}
		k.Keyring, k.KeyringFile = ring, f
	}
	return disp.SetKeys(k)
}

// KeyFiles are the [security] key files (vgpu-bridge keys init, enrol).
type KeyFiles struct {
	SigningKeyFile, KeyID, AgentKeysFile string
}

// SecurityKeyFiles returns the [security] key files v names.
func SecurityKeyFiles(v *conf.Values) KeyFiles {
	return KeyFiles{SigningKeyFile: optSecuritySigningKeyFile.Get(v), KeyID: optSecurityKeyID.Get(v),
		AgentKeysFile: optSecurityAgentKeysFile.Get(v)}
}
