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
	optSecuritySigningKeyFile = Options.String("security", "signing_key_file", "",
		"The bridge's private key, which signs every command it sends: PEM PKCS#8 Ed25519 "+
			"(openssl genpkey -algorithm ed25519 -out bridge.key). Agents trust its public key "+
			"(openssl pkey -in bridge.key -pubout) in their [security] bridge_keys_file with a \"Key-Id:\" header equal to "+
			"key_id. Mode 0600 or 0640. Re-read with key_id on SIGHUP: put the new key (with a new key_id) in place once agents trust it, then SIGHUP every replica. Empty: commands go unsigned (agents with signed commands required refuse them). "+
			"Example: /etc/vgpu-bridge/bridge.key")
	optSecurityKeyID = Options.String("security", "key_id", "",
		"The key id of signing_key_file, carried in key_id of every command; agents look the verification key up by it. "+
			"Change it with the key (rotation: agents trust the old and the new key for a while, the old one with a "+
			"\"Not-After:\" header). Example: bridge-2025a")
	optSecurityAgentKeysFile = Options.String("security", "agent_keys_file", "",
		"The agents' public keys: PEM \"PUBLIC KEY\" blocks (openssl pkey -pubout), each with the headers \"Key-Id:\" "+
			"(the agent's [security] key_id), \"Host:\" (the host whose results and reports it may sign) and, for a key "+
			"being rotated out, \"Not-After: <RFC 3339 time>\". A result or report that does not verify with the key of its "+
			"host is dropped, logged and counted in vgpu_bridge_dispatch_invalid_messages_total. Re-read on SIGHUP. "+
			"Must not be world-writable. Empty: results and reports are not verified. Example: /etc/vgpu-bridge/agent-keys.pem")
	optSecurityRequireSigned = Options.Choice("security", "require_signed_results", "auto", []string{"auto", "true", "false"},
		"Whether an unsigned result or report is dropped (reason unsigned). auto: true when agent_keys_file is set. "+
			"false is for the switch-over only: signed messages are still verified, unsigned ones are accepted, logged "+
			"and counted in vgpu_bridge_dispatch_unsigned_accepted_total. Example: true")
)

func init() {
	Options.SectionHelp("security", "Signed commands (the bridge's key) and signed results and reports (the agents' keys).")
	validators = append(validators, func(v *conf.Values) conf.Errors {
		var errs conf.Errors
		if (optSecuritySigningKeyFile.Get(v) == "") != (optSecurityKeyID.Get(v) == "") {
			errs = append(errs, &conf.Error{Section: "security", Option: "key_id", Value: optSecurityKeyID.Get(v),
				Problem: "signing_key_file and key_id go together"})
		}
		if optSecurityRequireSigned.Get(v) == "true" && optSecurityAgentKeysFile.Get(v) == "" {
			errs = append(errs, &conf.Error{Section: "security", Option: "require_signed_results", Value: "true",
				Problem: "needs agent_keys_file (the keys to verify with)"})
		}
		return errs
	})
}

// SecurityConfig reads the [security] key files into c (Signer, Keyring,
// RequireSigned). An unreadable or malformed file is an error: the bridge
// does not start rather than run with less trust than configured.
func SecurityConfig(v *conf.Values, c *dispatch.Config, log *slog.Logger) error {
	if f := optSecuritySigningKeyFile.Get(v); f != "" {
		s, err := protocol.LoadSigner(f, optSecurityKeyID.Get(v))
		if err != nil {
			return fmt.Errorf("[security] signing_key_file: %w", err)
		}
		c.Signer = s
	} else if log != nil {
		log.Warn("commands are not signed: set [security] signing_key_file and key_id")
	}
	if f := optSecurityAgentKeysFile.Get(v); f != "" {
		k, err := protocol.LoadKeyring(f)
		if err != nil {
			return fmt.Errorf("[security] agent_keys_file: %w", err)
		}
		c.Keyring = k
	} else if log != nil {
		log.Warn("results and reports are not verified: set [security] agent_keys_file")
	}
	switch optSecurityRequireSigned.Get(v) {
	case "true":
		c.RequireSigned = true
	case "false":
		c.RequireSigned = false
	default:
		c.RequireSigned = c.Keyring != nil
	}
	if c.Keyring != nil && !c.RequireSigned && log != nil {
		log.Warn("unsigned results and reports are accepted: [security] require_signed_results = false")
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
		k.Keyring = ring
	}
	return disp.SetKeys(k)
}
