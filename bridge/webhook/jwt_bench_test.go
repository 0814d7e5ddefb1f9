// SPDX-License-Identifier: Apache-2.0

package webhook

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// BenchmarkAuthenticate is the cost of one request's authentication, by
// scheme: a bearer token (the baseline: a SHA-256 and a constant-time
// compare), an HMAC over a 1 KiB body (Standard Webhooks), and a JWT of
// each accepted algorithm verified against a JWKS file.
func BenchmarkAuthenticate(b *testing.B) {
	k := keys(b)
	now := time.Unix(1_800_000_000, 0)
	body := make([]byte, 1024)
	b.Run("bearer", func(b *testing.B) {
		s := &source{cfg: Source{Auth: AuthBearer}}
		s.creds.Store(newCredentials(nil, []string{"a-bearer-token-of-forty-characters-long-x"}))
		r := httptest.NewRequest("POST", "/v1/webhooks/x", nil)
		r.Header.Set("Authorization", "Bearer a-bearer-token-of-forty-characters-long-x")
		for b.Loop() {
			if _, err := s.authenticate(r, body, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("hmac", func(b *testing.B) {
		key := []byte("a-shared-secret-of-32-bytes-long")
		s := &source{cfg: Source{Auth: AuthHMAC, TimestampTolerance: 5 * time.Minute}}
		s.creds.Store(newCredentials([][]byte{key}, nil))
		ts := "1800000000"
		r := httptest.NewRequest("POST", "/v1/webhooks/x", nil)
		r.Header.Set(HeaderWebhookID, "msg_1")
		r.Header.Set(HeaderWebhookTimestamp, ts)
		r.Header.Set(HeaderWebhookSignature, StandardSignature("msg_1", ts, body, key))
		for b.Loop() {
			if _, err := s.authenticate(r, body, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	file := filepath.Join(b.TempDir(), "jwks.json")
	if err := os.WriteFile(file, jwksOf(b, map[string]any{"rsa": k.rsa, "ec": k.ec, "ed": k.ed}), 0o600); err != nil {
		b.Fatal(err)
	}
	clk := &fakeClock{t: now}
	v := testVerifier(b, Source{JWKSFile: file, JWTLeeway: time.Minute}, clk, nil)
	for _, c := range []struct {
		name string
		key  any
		alg  jose.SignatureAlgorithm
	}{{"jwt-RS256", k.rsa, jose.RS256}, {"jwt-ES256", k.ec, jose.ES256}, {"jwt-EdDSA", k.ed, jose.EdDSA}} {
		var tok string
		switch c.alg {
		case jose.RS256:
			tok = mint(b, c.key, c.alg, "rsa", claimsAt(now))
		case jose.ES256:
			tok = mint(b, c.key, c.alg, "ec", claimsAt(now))
		case jose.EdDSA:
			tok = mint(b, c.key, c.alg, "ed", claimsAt(now))
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := v.verify(context.Background(), tok, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
