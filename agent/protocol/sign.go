package protocol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// Signing (the "key_id" and "sig" members of every message).
//
// Every command is signed by the bridge, every result and report by the
// agent of its host, with Ed25519. The signature is over
//
//	"vgpu-bridge/1 " + TYPE + "\n" + Canonical(body)
//
// where TYPE is "command", "result" or "report" (so a signed message of
// one type can never pass for another) and Canonical is RFC 8785 JSON of
// the message with its "sig" member removed — "key_id" and every other
// member, known or not, are covered. "sig" is the standard base64 (with
// padding) of the 64-byte signature; "key_id" names the verification key.
//
// Keys:
//   - a private key is a PEM "PRIVATE KEY" block (PKCS#8, as
//     `openssl genpkey -algorithm ed25519` writes it); its key id is
//     configured beside it; the file must not be readable or writable by
//     others;
//   - a keyring is a file of PEM "PUBLIC KEY" blocks (PKIX, as
//     `openssl pkey -pubout` writes them), each with the headers
//     "Key-Id" (required, unique), "Host" (agent keys: the host whose
//     results and reports it may sign; bridge keys have none) and
//     "Not-After" (optional, RFC 3339: the end of a rotated-out key's
//     grace period). Unknown headers are an error, so a misspelt
//     Not-After cannot leave a key trusted for ever.
//
// A bridge key (no Host) verifies commands only; an agent key (Host set)
// verifies only results and reports whose "host" is its Host.

// MessageType names what a signature covers.
type MessageType string

// Signed message types.
const (
	TypeCommand MessageType = "command"
	TypeResult  MessageType = "result"
	TypeReport  MessageType = "report"
)

// Result codes of the signature check (contract): a command refused with
// one of them was not executed.
const (
	// CodeBadSignature: the command is unsigned (while signed commands are
	// required), its signature is malformed, or it does not verify.
	CodeBadSignature = "bad_signature"
	// CodeUnknownKey: the command's key_id names no trusted key, or a key
	// that may not sign commands (an agent's key).
	CodeUnknownKey = "unknown_key"
	// CodeKeyExpired: the key's grace period (Not-After) has ended.
	CodeKeyExpired = "key_expired"
)

// PEM block types and headers of key files.
const (
	pemPrivate     = "PRIVATE KEY"
	pemPublic      = "PUBLIC KEY"
	headerKeyID    = "Key-Id"
	headerHost     = "Host"
	headerNotAfter = "Not-After"
)

// SignatureError is why a message did not verify.
type SignatureError struct {
	Code  string // CodeBadSignature, CodeUnknownKey or CodeKeyExpired
	KeyID string
	// Unsigned is set when the message carries no signature at all.
	Unsigned bool
	Msg      string
}

func (e *SignatureError) Error() string { return e.Msg }

// SignatureCode returns the result code of a verification error, or "".
func SignatureCode(err error) string {
	var se *SignatureError
	if errors.As(err, &se) {
		return se.Code
	}
	return ""
}

// IsUnsigned reports whether err says the message carried no signature.
func IsUnsigned(err error) bool {
	var se *SignatureError
	return errors.As(err, &se) && se.Unsigned
}

func sigErr(code, keyID, format string, args ...any) error {
	return &SignatureError{Code: code, KeyID: keyID, Msg: fmt.Sprintf(format, args...)}
}

// SigningInput is what is signed for a message of type t with body.
func SigningInput(t MessageType, body []byte) ([]byte, error) {
	canon, err := Canonical(body)
	if err != nil {
		return nil, err
	}
	return append([]byte("vgpu-bridge/1 "+string(t)+"\n"), canon...), nil
}

// Signer signs messages with one Ed25519 private key. It is safe for
// concurrent use.
type Signer struct {
	id  string
	key ed25519.PrivateKey
}

// NewSigner returns a signer whose messages name keyID.
func NewSigner(keyID string, key ed25519.PrivateKey) (*Signer, error) {
	if err := validKeyID(keyID); err != nil {
		return nil, err
	}
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("signer: not an Ed25519 private key")
	}
	return &Signer{id: keyID, key: key}, nil
}

// ParseSigner reads a PEM PKCS#8 Ed25519 private key (what
// `openssl genpkey -algorithm ed25519` writes) whose messages name keyID.
func ParseSigner(data []byte, keyID string) (*Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != pemPrivate {
		return nil, fmt.Errorf("signing key: no PEM %q block", pemPrivate)
	}
	if p, _ := pem.Decode(rest); p != nil {
		return nil, errors.New("signing key: more than one PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key: %T is not an Ed25519 key", k)
	}
	return NewSigner(keyID, priv)
}

// LoadSigner reads the private key file at path (see ParseSigner). The
// file must not be readable or writable by others than owner and group.
func LoadSigner(path, keyID string) (*Signer, error) {
	data, err := readKeyFile(path, 0o007)
	if err != nil {
		return nil, err
	}
	s, err := ParseSigner(data, keyID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// KeyID is the key id the signer's messages carry.
func (s *Signer) KeyID() string { return s.id }

// PublicKey is the verification key.
func (s *Signer) PublicKey() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// SignCommand sets c.KeyID and c.Sig.
func (s *Signer) SignCommand(c *Command) error {
	c.KeyID, c.Sig = s.id, ""
	sig, err := s.sign(TypeCommand, c)
	c.Sig = sig
	return err
}

// SignResult sets r.KeyID and r.Sig.
func (s *Signer) SignResult(r *Result) error {
	r.KeyID, r.Sig = s.id, ""
	sig, err := s.sign(TypeResult, r)
	r.Sig = sig
	return err
}

// SignReport sets r.KeyID and r.Sig.
func (s *Signer) SignReport(r *Report) error {
	r.KeyID, r.Sig = s.id, ""
	sig, err := s.sign(TypeReport, r)
	r.Sig = sig
	return err
}

// SignBody returns body (one JSON object) with "key_id" set to the
// signer's and "sig" set, for a message type without a Go struct here.
func (s *Signer) SignBody(t MessageType, body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	id, _ := json.Marshal(s.id)
	m["key_id"] = id
	delete(m, "sig")
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	in, err := SigningInput(t, b)
	if err != nil {
		return nil, err
	}
	sig, _ := json.Marshal(base64.StdEncoding.EncodeToString(ed25519.Sign(s.key, in)))
	m["sig"] = sig
	return json.Marshal(m)
}

func (s *Signer) sign(t MessageType, v any) (string, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	in, err := SigningInput(t, body)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(ed25519.Sign(s.key, in)), nil
}

// TrustedKey is a verification key of a keyring.
type TrustedKey struct {
	ID  string
	Key ed25519.PublicKey
	// Host, for an agent's key, is the host whose results and reports it
	// signs. Empty for a bridge key, which signs commands.
	Host string
	// NotAfter, when set, ends the key's grace period: later, messages
	// signed with it are refused (key_expired).
	NotAfter time.Time
}

// Keyring holds the keys trusted at once (several during a rotation). It
// is immutable; reload by building a new one.
type Keyring struct {
	keys map[string]TrustedKey
}

// NewKeyring returns a keyring of keys; ids must be unique.
func NewKeyring(keys ...TrustedKey) (*Keyring, error) {
	k := &Keyring{keys: make(map[string]TrustedKey, len(keys))}
	for _, t := range keys {
		if err := validKeyID(t.ID); err != nil {
			return nil, err
		}
		if len(t.Key) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("key %s: not an Ed25519 public key", t.ID)
		}
		if _, dup := k.keys[t.ID]; dup {
			return nil, fmt.Errorf("key id %s appears twice", t.ID)
		}
		k.keys[t.ID] = t
	}
	return k, nil
}

// ParseKeyring reads PEM "PUBLIC KEY" blocks with Key-Id, Host and
// Not-After headers. An empty file is an empty keyring.
func ParseKeyring(data []byte) (*Keyring, error) {
	var keys []TrustedKey
	rest := data
	for n := 1; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return nil, fmt.Errorf("keyring: block %d is not PEM", n)
			}
			break
		}
		if block.Type != pemPublic {
			return nil, fmt.Errorf("keyring: block %d is %q, not %q", n, block.Type, pemPublic)
		}
		for h := range block.Headers {
			if h != headerKeyID && h != headerHost && h != headerNotAfter {
				return nil, fmt.Errorf("keyring: block %d: unknown header %q (use Key-Id, Host, Not-After)", n, h)
			}
		}
		t := TrustedKey{ID: block.Headers[headerKeyID], Host: block.Headers[headerHost]}
		if t.ID == "" {
			return nil, fmt.Errorf("keyring: block %d has no Key-Id header", n)
		}
		pub, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("keyring: key %s: %w", t.ID, err)
		}
		if t.Key, _ = pub.(ed25519.PublicKey); t.Key == nil {
			return nil, fmt.Errorf("keyring: key %s: %T is not an Ed25519 key", t.ID, pub)
		}
		if na := block.Headers[headerNotAfter]; na != "" {
			if t.NotAfter, err = time.Parse(time.RFC3339, na); err != nil {
				return nil, fmt.Errorf("keyring: key %s: Not-After %q is not RFC 3339 (2025-03-01T00:00:00Z)", t.ID, na)
			}
		}
		keys = append(keys, t)
	}
	k, err := NewKeyring(keys...)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	return k, nil
}

// LoadKeyring reads the keyring file at path (see ParseKeyring). The file
// must not be writable by others.
func LoadKeyring(path string) (*Keyring, error) {
	data, err := readKeyFile(path, 0o002)
	if err != nil {
		return nil, err
	}
	k, err := ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// Keys returns the keys, by id.
func (k *Keyring) Keys() []TrustedKey {
	out := make([]TrustedKey, 0, len(k.keys))
	for _, t := range k.keys {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b TrustedKey) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Has tells whether the keyring holds a key with id.
func (k *Keyring) Has(id string) bool {
	_, ok := k.keys[id]
	return ok
}

// Len is the number of keys.
func (k *Keyring) Len() int { return len(k.keys) }

// Verify checks the signature of a message body of type t at time now and
// returns the key that signed it. Errors are *SignatureError.
func (k *Keyring) Verify(t MessageType, body []byte, now time.Time) (TrustedKey, error) {
	return k.VerifyMax(t, body, now, MaxMessageBytes)
}

// VerifyMax is Verify with a size limit of limit bytes (diagnostics
// bundles: MaxBundleMessageBytes).
func (k *Keyring) VerifyMax(t MessageType, body []byte, now time.Time, limit int) (TrustedKey, error) {
	if len(body) > limit {
		return TrustedKey{}, sigErr(CodeBadSignature, "", "message is %d bytes, more than %d", len(body), limit)
	}
	obj, err := parseObject(body)
	if err != nil {
		return TrustedKey{}, sigErr(CodeBadSignature, "", "cannot canonicalize the message: %v", err)
	}
	keyID, _ := obj["key_id"].(string)
	sig, _ := obj["sig"].(string)
	if sig == "" {
		return TrustedKey{}, &SignatureError{Code: CodeBadSignature, KeyID: keyID, Unsigned: true, Msg: "the message is not signed"}
	}
	if keyID == "" {
		return TrustedKey{}, sigErr(CodeUnknownKey, "", "the message is signed but names no key_id")
	}
	key, ok := k.keys[keyID]
	if !ok {
		return TrustedKey{}, sigErr(CodeUnknownKey, keyID, "key %q is not trusted", keyID)
	}
	host, _ := obj["host"].(string)
	switch {
	case t == TypeCommand && key.Host != "":
		return TrustedKey{}, sigErr(CodeUnknownKey, keyID, "key %q is the agent key of %s and may not sign commands", keyID, key.Host)
	case t != TypeCommand && key.Host == "":
		return TrustedKey{}, sigErr(CodeUnknownKey, keyID, "key %q is not an agent key (no Host) and may not sign a %s", keyID, t)
	case t != TypeCommand && key.Host != host:
		return TrustedKey{}, sigErr(CodeUnknownKey, keyID, "key %q belongs to host %q, the %s is from %q", keyID, key.Host, t, host)
	}
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return TrustedKey{}, sigErr(CodeBadSignature, keyID, "sig is not the base64 of a %d-byte signature", ed25519.SignatureSize)
	}
	delete(obj, "sig")
	var b bytes.Buffer
	b.WriteString("vgpu-bridge/1 " + string(t) + "\n")
	writeCanonical(&b, obj)
	if !ed25519.Verify(key.Key, b.Bytes(), raw) {
		return TrustedKey{}, sigErr(CodeBadSignature, keyID, "the signature does not verify with key %q", keyID)
	}
	if !key.NotAfter.IsZero() && now.After(key.NotAfter) {
		return TrustedKey{}, sigErr(CodeKeyExpired, keyID, "key %q was trusted until %s (end of its grace period)",
			keyID, key.NotAfter.UTC().Format(time.RFC3339))
	}
	return key, nil
}

// GenerateKey makes a new Ed25519 key pair and returns the private key
// file (PEM PKCS#8) and its keyring entry (PEM PKIX with Key-Id and, for
// an agent key, Host).
func GenerateKey(keyID, host string) (private, public []byte, err error) {
	if err := validKeyID(keyID); err != nil {
		return nil, nil, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	private, err = MarshalPrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	public, err = MarshalTrustedKey(TrustedKey{ID: keyID, Key: pub, Host: host})
	return private, public, err
}

// MarshalPrivateKey encodes key as a PEM PKCS#8 block, as openssl does.
func MarshalPrivateKey(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivate, Bytes: der}), nil
}

// MarshalTrustedKey encodes a keyring entry.
func MarshalTrustedKey(t TrustedKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(t.Key)
	if err != nil {
		return nil, err
	}
	h := map[string]string{headerKeyID: t.ID}
	if t.Host != "" {
		h[headerHost] = t.Host
	}
	if !t.NotAfter.IsZero() {
		h[headerNotAfter] = t.NotAfter.UTC().Format(time.RFC3339)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublic, Headers: h, Bytes: der}), nil
}

func validKeyID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r == 0x7f || r == ':' }) {
		return fmt.Errorf("key id %q must be 1-128 printable characters without spaces or ':'", id)
	}
	return nil
}

// readKeyFile reads path after checking that none of the permission bits
// in forbidden are set.
func readKeyFile(path string, forbidden os.FileMode) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("key file %s is not a regular file", path)
	}
	if p := st.Mode().Perm(); p&forbidden != 0 {
		return nil, fmt.Errorf("key file %s has mode %v: chmod it so that %v is clear", path, p, forbidden)
	}
	if st.Size() > MaxMessageBytes {
		return nil, fmt.Errorf("key file %s is larger than %d bytes", path, MaxMessageBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	return b, nil
}
