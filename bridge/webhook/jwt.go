// SPDX-License-Identifier: Apache-2.0

package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

// JWTAlgorithms are the only signature algorithms a jwt source accepts:
// none, the HMAC ones (a public key is no secret) and the others are
// refused before any key is looked at.
var JWTAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.EdDSA}

// Limits of a token.
const (
	maxJWTBytes = 16 << 10
	// MaxJWTLeeway bounds jwt_leeway.
	MaxJWTLeeway = 5 * time.Minute
	// maxClaimProjects bounds the projects a token may name.
	maxClaimProjects = 1000
	// DefaultJWTMaxLifetime is jwt_max_lifetime's default: the longest
	// a token may be valid for, from iat (or nbf) to exp.
	DefaultJWTMaxLifetime = time.Hour
	// MaxJWTMaxLifetime bounds jwt_max_lifetime.
	MaxJWTMaxLifetime = 24 * time.Hour
)

// DefaultJWTAudience is the audience a jwt source's tokens must name when
// it sets no jwt_audience: one of its own, so that a token issued for one
// source is refused by every other.
func DefaultJWTAudience(source string) string { return "vgpu-bridge:webhook:" + source }

// jwtVerifier checks the tokens of an auth = jwt source.
type jwtVerifier struct {
	issuer        string
	audience      string
	leeway        time.Duration
	maxLifetime   time.Duration
	projectsClaim string
	keys          *jwks
}

func newJWTVerifier(s *Source, log *slog.Logger, now func() time.Time) (*jwtVerifier, error) {
	v := &jwtVerifier{issuer: s.JWTIssuer, audience: s.JWTAudience, leeway: s.JWTLeeway, maxLifetime: s.JWTMaxLifetime,
		projectsClaim: s.JWTProjectsClaim, keys: newJWKS(s, log, now)}
	if s.JWKSFile != "" {
		ks, err := readJWKSFile(s.JWKSFile)
		if err != nil {
			return nil, err
		}
		ks.at = now()
		v.keys.set.Store(ks)
	}
	return v, nil
}

// jwtGrant is what a verified token allows.
type jwtGrant struct {
	// projects are the projects of the token's projects claim, when the
	// source names one (scoped).
	projects []string
	scoped   bool
	// subject is the token's sub.
	subject string
}

// keySpace is the idempotency-key space of a scoped grant: one source
// serves several tenants, each with keys of its own, told apart by the
// token's sub and projects (hashed: the claim may name many).
func (g jwtGrant) keySpace() string {
	if !g.scoped {
		return ""
	}
	b, _ := json.Marshal(struct {
		Sub      string   `json:"sub"`
		Projects []string `json:"projects"`
	}{g.subject, slices.Sorted(slices.Values(g.projects))})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// clip shortens a value from a token for a refusal's detail.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// verify checks a token: its algorithm (RS256, ES256 or EdDSA), its
// signature by a key of the source's JWKS (the one its kid names; a token
// without a kid is tried against each key of its algorithm, at most
// maxKeysWithoutKID), iss, aud, exp (required), nbf and iat (not in the
// future), each time with the leeway, the lifetime (exp after iat, or nbf,
// or now without either, by at most maxLifetime), and the projects claim
// when the source names one. A token whose kid is not among the keys in
// hand waits, at most until ctx ends, for the fetch that looks for it. Keys a token carries itself (jwk, jku, x5c, x5u) are
// never used. The token is never logged.
func (v *jwtVerifier) verify(ctx context.Context, tok string, now time.Time) (jwtGrant, *authError) {
	if tok == "" {
		return jwtGrant{}, authFail("missing_token", "send Authorization: Bearer <JWT>")
	}
	if len(tok) > maxJWTBytes {
		return jwtGrant{}, authFail("bad_token", "the token is longer than %d bytes", maxJWTBytes)
	}
	sig, err := jose.ParseSignedCompact(tok, JWTAlgorithms)
	if err != nil {
		if ua, ok := errors.AsType[*jose.ErrUnexpectedSignatureAlgorithm](err); ok && ua.Got != "" {
			return jwtGrant{}, authFail("bad_algorithm", "alg %q is not accepted; RS256, ES256 or EdDSA are", clip(string(ua.Got)))
		}
		return jwtGrant{}, authFail("bad_token", "not a signed JWT (JWS compact serialization)")
	}
	if len(sig.Signatures) != 1 {
		return jwtGrant{}, authFail("bad_token", "not a signed JWT (JWS compact serialization)")
	}
	h := sig.Signatures[0].Header
	alg := jose.SignatureAlgorithm(h.Algorithm)
	ks, unavailable := v.keys.keys(ctx, h.KeyID)
	if ks == nil {
		return jwtGrant{}, &authError{reason: "jwks_unavailable", status: http.StatusServiceUnavailable,
			retryAfter: v.keys.retryIn(),
			detail:     "the keys that verify this source's tokens could not be loaded; retry later"}
	}
	cands, kidKnown := ks.candidates(h.KeyID, alg)
	if unavailable && !kidKnown && h.KeyID != "" {
		// Perhaps a key the issuer has just rotated to: the sender
		// retries rather than gives up.
		return jwtGrant{}, &authError{reason: "jwks_unavailable", status: http.StatusServiceUnavailable,
			retryAfter: v.keys.retryIn(),
			detail:     fmt.Sprintf("kid %q is not among the keys in hand, and the source's JWKS could not be fetched to look for it; retry later", clip(h.KeyID))}
	}
	switch {
	case len(cands) == 0 && kidKnown:
		return jwtGrant{}, authFail("bad_algorithm", "key %q does not sign with %s", clip(h.KeyID), alg)
	case len(cands) == 0 && h.KeyID != "":
		return jwtGrant{}, authFail("unknown_key", "kid %q is not a key of this source's JWKS", clip(h.KeyID))
	case len(cands) == 0:
		return jwtGrant{}, authFail("unknown_key", "the token has no kid and no key of this source's JWKS signs with %s", alg)
	case h.KeyID == "" && len(cands) > maxKeysWithoutKID:
		return jwtGrant{}, authFail("unknown_key", "the token has no kid and %d keys sign with %s; name one", len(cands), alg)
	}
	var payload []byte
	for _, k := range cands {
		if p, err := sig.Verify(k); err == nil {
			payload = p
			break
		}
	}
	if payload == nil {
		return jwtGrant{}, authFail("bad_signature", "the signature does not verify with the source's key")
	}
	var c jwt.Claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return jwtGrant{}, authFail("bad_token", "the claims are not a JSON object of well-typed registered claims")
	}
	if c.Expiry == nil {
		return jwtGrant{}, authFail("bad_token", "the token has no exp: tokens must expire")
	}
	err = c.ValidateWithLeeway(jwt.Expected{Issuer: v.issuer, AnyAudience: jwt.Audience{v.audience}, Time: now}, v.leeway)
	switch {
	case err == nil:
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return jwtGrant{}, authFail("wrong_issuer", "iss %q is not this source's issuer", clip(c.Issuer))
	case errors.Is(err, jwt.ErrInvalidAudience):
		return jwtGrant{}, authFail("wrong_audience", "aud does not name this source's audience")
	case errors.Is(err, jwt.ErrExpired):
		return jwtGrant{}, authFail("token_expired", "the token expired at %s (leeway %s)", c.Expiry.Time().UTC().Format(time.RFC3339), v.leeway)
	case errors.Is(err, jwt.ErrNotValidYet):
		return jwtGrant{}, authFail("token_not_yet_valid", "the token is valid from %s (leeway %s)", c.NotBefore.Time().UTC().Format(time.RFC3339), v.leeway)
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return jwtGrant{}, authFail("token_not_yet_valid", "the token is issued at %s, in the future (leeway %s)", c.IssuedAt.Time().UTC().Format(time.RFC3339), v.leeway)
	default:
		return jwtGrant{}, authFail("bad_token", "the claims do not validate")
	}
	if aerr := v.checkLifetime(&c, now); aerr != nil {
		return jwtGrant{}, aerr
	}
	if v.projectsClaim == "" {
		return jwtGrant{}, nil
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(payload, &all); err != nil {
		return jwtGrant{}, authFail("bad_token", "the claims are not a JSON object")
	}
	raw, ok := all[v.projectsClaim]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return jwtGrant{}, authFail("missing_projects_claim", "the token has no %q claim naming its projects", v.projectsClaim)
	}
	projects, ok := claimStrings(raw)
	if !ok {
		return jwtGrant{}, authFail("bad_token", "the %q claim must be a string or an array of at most %d strings", v.projectsClaim, maxClaimProjects)
	}
	return jwtGrant{projects: projects, scoped: true, subject: c.Subject}, nil
}

// checkLifetime refuses a token valid for longer than maxLifetime: from
// its iat, or its nbf, to its exp; without either, from now (with the
// leeway, for the issuer's clock).
func (v *jwtVerifier) checkLifetime(c *jwt.Claims, now time.Time) *authError {
	if v.maxLifetime <= 0 {
		return nil
	}
	exp := c.Expiry.Time()
	var life time.Duration
	var from string
	switch {
	case c.IssuedAt != nil:
		life, from = exp.Sub(c.IssuedAt.Time()), "iat"
	case c.NotBefore != nil:
		life, from = exp.Sub(c.NotBefore.Time()), "nbf"
	default:
		life, from = exp.Sub(now)-v.leeway, "now (the token has no iat)"
	}
	if life > v.maxLifetime {
		return authFail("token_lifetime_too_long", "the token is valid for %s from %s to exp; this source accepts at most %s (jwt_max_lifetime)",
			life.Round(time.Second), from, v.maxLifetime)
	}
	return nil
}

// claimStrings reads a claim that is a string or an array of strings;
// empty strings are dropped (they name no project).
func claimStrings(raw json.RawMessage) ([]string, bool) {
	var many []string
	var one string
	switch {
	case json.Unmarshal(raw, &one) == nil:
		many = []string{one}
	case json.Unmarshal(raw, &many) == nil:
	default:
		return nil, false
	}
	if len(many) > maxClaimProjects {
		return nil, false
	}
	out := make([]string, 0, len(many))
	for _, p := range many {
		if p != "" {
			out = append(out, p)
		}
	}
	return out, true
}

// narrowProjects is the projects a request may act on when a token's
// claim names claimed: those, and only those of allowed when the source
// has allowed projects.
func narrowProjects(allowed, claimed []string) []string {
	out := make([]string, 0, len(claimed))
	for _, p := range claimed {
		if len(allowed) == 0 || slices.Contains(allowed, p) {
			out = append(out, p)
		}
	}
	return out
}

func (s *source) verifyJWT(r *http.Request, now time.Time) (jwtGrant, *authError) {
	if s.jwt == nil {
		return jwtGrant{}, authFail("misconfigured", "source has no usable auth")
	}
	return s.jwt.verify(r.Context(), api.BearerToken(r), now)
}
