package apiclient

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Webhook authentication schemes a sender can use.
const (
	// SchemeHub is X-Hub-Signature-256 = sha256=hex(HMAC-SHA256(key, body))
	// with an Idempotency-Key. The MAC covers the body alone: the bridge
	// acts on a body once, so a repeated request needs a new body (a
	// nonce or timestamp field).
	SchemeHub = "hub"
	// SchemeStandard is Standard Webhooks: webhook-id, webhook-timestamp and
	// webhook-signature = v1,base64(HMAC-SHA256(key, id.timestamp.body)).
	SchemeStandard = "standard"
	// SchemeBearer sends the secret as Authorization: Bearer.
	SchemeBearer = "bearer"
)

// WebhookKey turns the text of a secret file into the HMAC key exactly as
// the bridge does: surrounding white space is dropped; "whsec_<base64>" is
// the decoded bytes; anything else is used as its bytes (16 at least).
func WebhookKey(text string) ([]byte, error) {
	text = strings.TrimSpace(text)
	if rest, ok := strings.CutPrefix(text, "whsec_"); ok {
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

// HubSignature returns the X-Hub-Signature-256 value of body under key.
func HubSignature(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// StandardSignature returns the webhook-signature value ("v1,<base64>") of
// body for the given webhook-id and webhook-timestamp.
func StandardSignature(key []byte, id, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// NewIdempotencyKey returns a random key ("vgpuctl-" and 24 hex digits).
func NewIdempotencyKey() string {
	var b [12]byte
	rand.Read(b[:])
	return "vgpuctl-" + hex.EncodeToString(b[:])
}

// WebhookAuth is how a webhook is authenticated.
type WebhookAuth struct {
	// Scheme is SchemeHub, SchemeStandard or SchemeBearer.
	Scheme string
	// Key is the HMAC key (WebhookKey of the secret), or the bearer token.
	Key []byte
	// IdempotencyKey is sent as Idempotency-Key (hub) or webhook-id
	// (standard); empty makes a random one.
	IdempotencyKey string
	// Now is the clock of webhook-timestamp; nil means time.Now.
	Now func() time.Time
}

// SignWebhook sets the authentication headers of body on h and returns the
// idempotency key used.
func SignWebhook(h http.Header, a WebhookAuth, body []byte) (string, error) {
	key := a.IdempotencyKey
	if key == "" && a.Scheme != SchemeBearer {
		key = NewIdempotencyKey()
	}
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	switch a.Scheme {
	case SchemeHub, "":
		h.Set("X-Hub-Signature-256", HubSignature(a.Key, body))
		h.Set("Idempotency-Key", key)
	case SchemeStandard:
		ts := strconv.FormatInt(now().Unix(), 10)
		h.Set("Webhook-Id", key)
		h.Set("Webhook-Timestamp", ts)
		h.Set("Webhook-Signature", StandardSignature(a.Key, key, ts, body))
	case SchemeBearer:
		h.Set("Authorization", "Bearer "+strings.TrimSpace(string(a.Key)))
		if key != "" {
			h.Set("Idempotency-Key", key)
		}
	default:
		return "", fmt.Errorf("webhook scheme %q: use hub, standard or bearer", a.Scheme)
	}
	return key, nil
}

// SendWebhook posts body to /v1/webhooks/{source}, authenticated by a, and
// returns the 202 answer. The operator token is not sent.
func (c *Client) SendWebhook(ctx context.Context, source string, body []byte, a WebhookAuth) (WebhookAnswer, error) {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if _, err := SignWebhook(h, a, body); err != nil {
		return WebhookAnswer{}, err
	}
	var out WebhookAnswer
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/webhooks/" + url.PathEscape(source), Body: body, Header: h, NoAuth: true}, &out)
	out.Raw = raw
	return out, err
}
