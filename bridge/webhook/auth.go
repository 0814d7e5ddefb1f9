package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/internal/clock"
)

// Header names of the two HMAC schemes and of idempotency.
const (
	HeaderHubSignature     = "X-Hub-Signature-256"
	HeaderWebhookID        = "Webhook-Id"
	HeaderWebhookTimestamp = "Webhook-Timestamp"
	HeaderWebhookSignature = "Webhook-Signature"
	HeaderIdempotencyKey   = "Idempotency-Key"
	// HeaderGitHubDelivery is GitHub's delivery id: the key of a delivery
	// signed with X-Hub-Signature-256 that carries no Idempotency-Key.
	HeaderGitHubDelivery = "X-GitHub-Delivery"
)

// SecretPrefix marks a Standard Webhooks secret: the base64 text after it
// is the key. Other secrets are used as their bytes.
const SecretPrefix = "whsec_"

// SecretKey turns the text of a secret file into the HMAC key.
func SecretKey(text string) ([]byte, error) {
	text = strings.TrimSpace(text)
	if rest, ok := strings.CutPrefix(text, SecretPrefix); ok {
		k, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, errors.New("a whsec_ secret must be base64 after the prefix")
		}
		if len(k) < 16 {
			return nil, fmt.Errorf("a whsec_ secret must hold at least 16 bytes (has %d)", len(k))
		}
		return k, nil
	}
	if len(text) < 16 {
		return nil, fmt.Errorf("a secret must be at least 16 characters (has %d)", len(text))
	}
	return []byte(text), nil
}

// authError is a refusal with a stable reason: 401, or status when set
// (503 jwks_unavailable, with retryAfter).
type authError struct {
	reason     string
	detail     string
	status     int
	retryAfter time.Duration
}

func (e *authError) Error() string { return e.reason + ": " + e.detail }

func authFail(reason, format string, args ...any) *authError {
	return &authError{reason: reason, detail: fmt.Sprintf(format, args...)}
}

// ParseHubSignature parses "sha256=<64 hex digits>" and returns the MAC.
func ParseHubSignature(h string) ([]byte, error) {
	rest, ok := strings.CutPrefix(h, "sha256=")
	if !ok {
		return nil, errors.New(`want "sha256=<hex>"`)
	}
	if len(rest) != 2*sha256.Size {
		return nil, fmt.Errorf("want %d hex digits after sha256=", 2*sha256.Size)
	}
	mac, err := hex.DecodeString(rest)
	if err != nil {
		return nil, errors.New("not hex after sha256=")
	}
	return mac, nil
}

// ParseStandardSignatures parses a Standard Webhooks webhook-signature
// header: space-separated "v1,<base64 HMAC-SHA256>" entries. Entries of
// other versions (v1a: asymmetric) are skipped; at least one v1 entry must
// be there, and every v1 entry must be well formed.
func ParseStandardSignatures(h string) ([][]byte, error) {
	if len(h) > 4096 {
		return nil, errors.New("header too long")
	}
	var out [][]byte
	for _, f := range strings.Fields(h) {
		ver, sig, ok := strings.Cut(f, ",")
		if !ok {
			return nil, errors.New(`want "v1,<base64>" entries separated by spaces`)
		}
		if ver != "v1" {
			continue
		}
		mac, err := base64.StdEncoding.DecodeString(sig)
		if err != nil || len(mac) != sha256.Size {
			return nil, errors.New("a v1 signature must be the base64 of 32 bytes")
		}
		out = append(out, mac)
		if len(out) > 16 {
			return nil, errors.New("more than 16 signatures")
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no v1 signature")
	}
	return out, nil
}

// ParseTimestamp parses webhook-timestamp: integer seconds since the epoch.
func ParseTimestamp(s string) (time.Time, error) {
	if s == "" || len(s) > 12 {
		return time.Time{}, errors.New("want integer seconds since 1970")
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return time.Time{}, errors.New("want integer seconds since 1970")
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, errors.New("want integer seconds since 1970")
	}
	return time.Unix(n, 0), nil
}

// validKey reports whether an idempotency key or webhook-id is usable:
// 1 to 255 printable ASCII characters.
func validKey(k string) bool {
	if k == "" || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// HubSignature returns the X-Hub-Signature-256 value of body under key.
func HubSignature(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// StandardSignature returns the webhook-signature value of body under the
// given keys ("v1,<b64>" entries separated by spaces).
func StandardSignature(id, timestamp string, body []byte, keys ...[]byte) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = "v1," + base64.StdEncoding.EncodeToString(standardMAC(k, id, timestamp, body))
	}
	return strings.Join(parts, " ")
}

func standardMAC(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// anyEqual compares every candidate with every want in constant time per
// pair and without stopping early.
func anyEqual(wants, candidates [][]byte) bool {
	ok := 0
	for _, w := range wants {
		for _, c := range candidates {
			ok |= subtle.ConstantTimeCompare(w, c)
		}
	}
	return ok == 1
}

// verifyHMAC checks r's signature over payload with the source's keys. It
// returns the replay key: webhook-id (Standard Webhooks), or the
// Idempotency-Key or X-GitHub-Delivery of X-Hub-Signature-256 ("" when it
// has none). bodyOnly is true for X-Hub-Signature-256: its MAC covers the
// body alone, so the body itself must act at most once (commit keeps its
// digest).
func (s *source) verifyHMAC(h http.Header, payload []byte, now time.Time) (key string, bodyOnly bool, _ *authError) {
	if sig := h.Get(HeaderWebhookSignature); sig != "" || h.Get(HeaderWebhookID) != "" || h.Get(HeaderWebhookTimestamp) != "" {
		id, ts := h.Get(HeaderWebhookID), h.Get(HeaderWebhookTimestamp)
		if id == "" || ts == "" || sig == "" {
			return "", false, authFail("missing_signature", "Standard Webhooks needs webhook-id, webhook-timestamp and webhook-signature together")
		}
		if !validKey(id) {
			return "", false, authFail("bad_signature", "webhook-id must be 1 to 255 printable ASCII characters")
		}
		t, err := ParseTimestamp(ts)
		if err != nil {
			return "", false, authFail("bad_timestamp", "webhook-timestamp: %v", err)
		}
		if !clock.Within(t, now, s.cfg.TimestampTolerance) {
			return "", false, authFail("timestamp_skew", "webhook-timestamp is %s of the server's clock; at most %s either way is allowed",
				clock.Offset(t, now), s.cfg.TimestampTolerance)
		}
		sigs, err := ParseStandardSignatures(sig)
		if err != nil {
			return "", false, authFail("bad_signature", "webhook-signature: %v", err)
		}
		secrets := s.credentials().secrets
		wants := make([][]byte, len(secrets))
		for i, k := range secrets {
			wants[i] = standardMAC(k, id, ts, payload)
		}
		if !anyEqual(wants, sigs) {
			return "", false, authFail("bad_signature", "no webhook-signature matches a secret of this source")
		}
		return id, false, nil
	}
	hub := h.Get(HeaderHubSignature)
	if hub == "" {
		return "", false, authFail("missing_signature", "send X-Hub-Signature-256 with Idempotency-Key, or the Standard Webhooks headers")
	}
	mac, err := ParseHubSignature(hub)
	if err != nil {
		return "", false, authFail("bad_signature", "X-Hub-Signature-256: %v", err)
	}
	secrets := s.credentials().secrets
	wants := make([][]byte, len(secrets))
	for i, k := range secrets {
		m := hmac.New(sha256.New, k)
		m.Write(payload)
		wants[i] = m.Sum(nil)
	}
	if !anyEqual(wants, [][]byte{mac}) {
		return "", false, authFail("bad_signature", "X-Hub-Signature-256 matches no secret of this source")
	}
	key = h.Get(HeaderIdempotencyKey)
	if key == "" {
		key = h.Get(HeaderGitHubDelivery)
	}
	return key, true, nil
}

func (s *source) verifyBearer(r *http.Request) *authError {
	tok := api.BearerToken(r)
	if tok == "" {
		return authFail("missing_token", "send Authorization: Bearer <token>")
	}
	sum := sha256.Sum256([]byte(tok))
	ok := 0
	for _, t := range s.credentials().tokenSums {
		ok |= subtle.ConstantTimeCompare(sum[:], t[:])
	}
	if ok != 1 {
		return authFail("bad_token", "the token is not one of this source's")
	}
	return nil
}

func (s *source) verifyMTLS(r *http.Request) *authError {
	if r.TLS == nil {
		return authFail("no_client_certificate", "this source authenticates with client certificates; connect over TLS")
	}
	if len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return authFail("no_client_certificate", "present a client certificate signed by the webhook client CA")
	}
	if !s.certAllowed(r.TLS.PeerCertificates[0]) {
		return authFail("certificate_not_allowed", "the client certificate's subject and SANs match none this source allows")
	}
	return nil
}

func (s *source) certAllowed(c *x509.Certificate) bool {
	for _, want := range s.cfg.MTLSSubjects {
		if c.Subject.CommonName == want || c.Subject.String() == want {
			return true
		}
	}
	for _, want := range s.cfg.MTLSSANs {
		for _, n := range c.DNSNames {
			if strings.EqualFold(n, want) {
				return true
			}
		}
		for _, n := range c.EmailAddresses {
			if n == want {
				return true
			}
		}
		for _, u := range c.URIs {
			if u.String() == want {
				return true
			}
		}
		for _, ip := range c.IPAddresses {
			if ip.String() == want {
				return true
			}
		}
	}
	return false
}

// authn is what authenticate found.
type authn struct {
	// key is the replay key the scheme carries, if any; bodyOnly tells
	// that the signature covers the body alone (verifyHMAC).
	key      string
	bodyOnly bool
	// projects narrow the source's allowed projects when scoped: the
	// projects claim of a jwt source's token.
	projects []string
	scoped   bool
	// space, when set, is the caller's own idempotency-key space within
	// the source (jwtGrant.keySpace).
	space string
}

// authenticate checks r's credentials over payload (the body for POST).
func (s *source) authenticate(r *http.Request, payload []byte, now time.Time) (authn, *authError) {
	var a authn
	switch s.cfg.Auth {
	case AuthHMAC:
		key, bodyOnly, err := s.verifyHMAC(r.Header, payload, now)
		return authn{key: key, bodyOnly: bodyOnly}, err
	case AuthBearer:
		if err := s.verifyBearer(r); err != nil {
			return authn{}, err
		}
	case AuthMTLS:
		if err := s.verifyMTLS(r); err != nil {
			return authn{}, err
		}
	case AuthJWT:
		// Like a bearer token, a JWT covers no body: the replay key is
		// the Idempotency-Key.
		g, err := s.verifyJWT(r, now)
		if err != nil {
			return authn{}, err
		}
		a.projects, a.scoped, a.space = g.projects, g.scoped, g.keySpace()
	default:
		return authn{}, authFail("misconfigured", "source has no usable auth")
	}
	a.key = r.Header.Get(HeaderIdempotencyKey)
	return a, nil
}
