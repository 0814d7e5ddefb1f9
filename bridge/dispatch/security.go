package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Reasons a result or report is dropped (label reason of
// vgpu_bridge_dispatch_invalid_messages_total); the signature reasons are
// protocol.CodeBadSignature, CodeUnknownKey and CodeKeyExpired.
const (
	ReasonInvalid        = "invalid"
	ReasonUnsigned       = "unsigned"
	ReasonForeignRefusal = "foreign_refusal"
)

// Keys are the dispatcher's signing key and the agents' keyring.
type Keys struct {
	Signer        *protocol.Signer
	Keyring       *protocol.Keyring
	KeyringFile   string // Config.KeyringFile
	RequireSigned bool
}

// ringFile throttles and remembers the re-reads of Keys.KeyringFile.
type ringFile struct {
	mu      sync.Mutex
	checked time.Time   // last stat
	stamp   os.FileInfo // of the last read (nil: not read by the dispatcher yet)
}

// refreshKeyring re-reads k.KeyringFile when a message names a key id
// its keyring lacks: an operator who enrolls a host (vgpu-bridge keys
// enrol) adds its key to the file and needs no SIGHUP. The file is
// stat'ed at most once a second and read only when its size or
// modification time changed; a file that does not load leaves the keys
// in use (logged). It returns the keys to verify with.
func (x *Dispatcher) refreshKeyring(k *Keys) *Keys {
	if k.KeyringFile == "" {
		return k
	}
	x.ring.mu.Lock()
	defer x.ring.mu.Unlock()
	now := time.Now()
	if now.Sub(x.ring.checked) < time.Second {
		return x.keys()
	}
	x.ring.checked = now
	st, err := os.Stat(k.KeyringFile)
	if err != nil {
		x.log.Warn("dispatch: agent keys file", logkey.Err, err)
		return k
	}
	if old := x.ring.stamp; old != nil && old.Size() == st.Size() && old.ModTime().Equal(st.ModTime()) {
		return x.keys()
	}
	ring, err := protocol.LoadKeyring(k.KeyringFile)
	if err != nil {
		x.log.Error("dispatch: agent keys file does not load; keeping the keys in use", logkey.Err, err)
		return k
	}
	x.ring.stamp = st
	cur := x.keys()
	if cur.KeyringFile != k.KeyringFile { // a SIGHUP swapped the keys meanwhile
		return cur
	}
	next := *cur
	next.Keyring = ring
	x.keyset.Store(&next)
	x.log.Info("dispatch: agent keys file read again (a message named a key it did not hold)", "keys", ring.Len())
	return &next
}

func (x *Dispatcher) keys() *Keys { return x.keyset.Load() }

// Keys returns the keys in use.
func (x *Dispatcher) Keys() Keys { return *x.keys() }

// SetKeys replaces the keys in use (SIGHUP reload): later commands are
// signed with k.Signer, later results and reports verified with
// k.Keyring. An impossible set is refused and the keys in use stay.
func (x *Dispatcher) SetKeys(k Keys) error {
	if k.RequireSigned && k.Keyring == nil {
		return errors.New("signed results and reports are required but there is no keyring of agents' keys")
	}
	x.keyset.Store(&k)
	return nil
}

// sentDigests returns the SHA-256 (hex) of the bodies the relay may have
// published for a stored body: the stored text itself (unsigned relay)
// and the command re-encoded (signed relay: the row keeps the signed
// command, whose encoding is what went out).
func sentDigests(stored []byte) []string {
	sum := sha256.Sum256(stored)
	out := []string{hex.EncodeToString(sum[:])}
	var c protocol.Command
	if json.Unmarshal(stored, &c) == nil {
		if b, err := json.Marshal(c); err == nil {
			sum := sha256.Sum256(b)
			out = append(out, hex.EncodeToString(sum[:]))
		}
	}
	return out
}

// verified checks the signature of a result or report when a keyring is
// configured. A message that fails is logged and counted, and the caller
// drops it (acknowledged, never applied).
func (x *Dispatcher) verified(t protocol.MessageType, d amqp.Delivery) bool {
	k := x.keys()
	ring := k.Keyring
	if ring == nil {
		return true
	}
	limit := protocol.MaxMessageBytes
	if t == protocol.TypeResult {
		limit = protocol.MaxBundleMessageBytes // only a bundle's result may be that big: handleResult checks
	}
	_, err := ring.VerifyMax(t, d.Body, time.Now(), limit)
	if protocol.SignatureCode(err) == protocol.CodeUnknownKey && !ring.Has(keyIDOf(err)) {
		if k = x.refreshKeyring(k); k.Keyring != ring && k.Keyring != nil {
			ring = k.Keyring
			_, err = ring.VerifyMax(t, d.Body, time.Now(), limit)
		}
	}
	if err == nil {
		return true
	}
	var se *protocol.SignatureError
	keyID := ""
	if errors.As(err, &se) {
		keyID = se.KeyID
	}
	if protocol.IsUnsigned(err) {
		if !k.RequireSigned {
			x.m.unsigned.WithLabelValues(string(t)).Inc()
			x.log.Warn("dispatch: unsigned message accepted (signed results and reports are not required)",
				"type", string(t), "routing_key", d.RoutingKey)
			return true
		}
		x.m.broken.WithLabelValues(string(t), ReasonUnsigned).Inc()
		x.log.Warn("dispatch: unsigned message dropped", "type", string(t), "reason", ReasonUnsigned,
			"routing_key", d.RoutingKey, "message_id", d.MessageId)
		return false
	}
	code := protocol.SignatureCode(err)
	if code == "" {
		code = protocol.CodeBadSignature
	}
	x.m.broken.WithLabelValues(string(t), code).Inc()
	x.log.Warn("dispatch: message with a bad signature dropped", "type", string(t), "reason", code, "key_id", keyID,
		"routing_key", d.RoutingKey, "message_id", d.MessageId, logkey.Err, err)
	return false
}

// keyIDOf is the key id a signature error names ("" for none).
func keyIDOf(err error) string {
	var se *protocol.SignatureError
	if errors.As(err, &se) {
		return se.KeyID
	}
	return ""
}

// ownRefusal tells whether a result may be applied. A refusal coded
// bad_signature, unknown_key or key_expired says only that the agent got
// a command with that id it would not run — anyone who can publish on the
// broker can send one that borrows a real command's id. It is about the
// bridge's command only when its details.body_sha256 is the digest of
// the body the bridge sent; otherwise it is dropped (logged, counted) and
// the command stays in flight. Other results, and results of commands
// the bridge does not know (the pipeline ignores them), pass.
func (x *Dispatcher) ownRefusal(ctx context.Context, r protocol.Result) (bool, error) {
	if r.Status != protocol.Refused {
		return true, nil
	}
	switch r.Code {
	case protocol.CodeBadSignature, protocol.CodeUnknownKey, protocol.CodeKeyExpired:
	default:
		return true, nil
	}
	// FOR SHARE waits for the relay's transaction, which holds the row
	// until the broker confirmed and the signed body is written back.
	var stored []byte
	err := x.d.Pool.QueryRow(ctx, `SELECT body::text FROM commands WHERE id::text = $1 FOR SHARE`, r.CommandID).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("body of command %s: %w", r.CommandID, err)
	}
	var det struct {
		BodySHA256 string `json:"body_sha256"`
	}
	if len(r.Details) > 0 {
		_ = json.Unmarshal(r.Details, &det)
	}
	if det.BodySHA256 != "" {
		for _, d := range sentDigests(stored) {
			if d == det.BodySHA256 {
				return true, nil
			}
		}
	}
	x.m.broken.WithLabelValues(string(protocol.TypeResult), ReasonForeignRefusal).Inc()
	x.log.Warn("dispatch: refusal of a command body the bridge did not send dropped; the command stays in flight",
		logkey.Command, r.CommandID, logkey.Host, r.Host, "reason", ReasonForeignRefusal, "code", r.Code, "body_sha256", det.BodySHA256)
	return false, nil
}
