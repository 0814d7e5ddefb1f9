// SPDX-License-Identifier: Apache-2.0

package webhook

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Limits of a JWKS and of fetching one.
const (
	maxJWKSBytes     = 1 << 20
	jwksFetchTimeout = 10 * time.Second
	// DefaultJWKSRefresh is jwks_refresh_interval's default.
	DefaultJWKSRefresh = 5 * time.Minute
	// defaultJWKSMinInterval is the least time between two fetches of a
	// jwks_url, whatever asks for them: tokens naming a kid the set lacks
	// cannot make the bridge hammer the issuer.
	defaultJWKSMinInterval = 10 * time.Second
	minRSABits             = 2048
)

// CheckJWKSURL reports why u cannot be a jwks_url: it must be https, or
// http to a loopback host (a local sidecar, tests), and hold no
// credentials.
func CheckJWKSURL(u string) error {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" || p.Opaque != "" {
		return errors.New("not an absolute URL")
	}
	if p.User != nil {
		return errors.New("must not hold credentials")
	}
	switch p.Scheme {
	case "https":
		return nil
	case "http":
		if isLoopbackHost(p.Hostname()) {
			return nil
		}
		return errors.New("http is allowed only to a loopback host; use https")
	}
	return fmt.Errorf("scheme %q is not https", p.Scheme)
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}

// keySet is the usable signing keys of a JWKS: public RSA keys of 2048
// bits or more (RS256), EC P-256 keys (ES256) and Ed25519 keys (EdDSA),
// whose use, when given, is sig and whose alg, when given, is that one.
// Other keys (encryption keys, symmetric keys, other curves) are left out.
type keySet struct {
	keys []jose.JSONWebKey
	at   time.Time // when it was loaded
	// stamp is the jwks_file's modification time and size as read.
	stamp fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func (a fileStamp) equal(b fileStamp) bool { return a.mod.Equal(b.mod) && a.size == b.size }

// keyAlg is the one algorithm a usable key verifies.
func keyAlg(k jose.JSONWebKey) jose.SignatureAlgorithm {
	switch key := k.Key.(type) {
	case *rsa.PublicKey:
		return jose.RS256
	case *ecdsa.PublicKey:
		if key.Curve == elliptic.P256() {
			return jose.ES256
		}
	case ed25519.PublicKey:
		return jose.EdDSA
	}
	return ""
}

// usableKey returns k's public part when it is a key the bridge verifies
// with.
func usableKey(k jose.JSONWebKey) (jose.JSONWebKey, bool) {
	if (k.Use != "" && k.Use != "sig") || !k.Valid() {
		return jose.JSONWebKey{}, false
	}
	pub := k.Public()
	if !pub.Valid() {
		return jose.JSONWebKey{}, false
	}
	if rk, ok := pub.Key.(*rsa.PublicKey); ok && rk.N.BitLen() < minRSABits {
		return jose.JSONWebKey{}, false
	}
	alg := keyAlg(pub)
	if alg == "" || (pub.Algorithm != "" && pub.Algorithm != string(alg)) {
		return jose.JSONWebKey{}, false
	}
	return pub, true
}

// parseKeySet reads a JWKS ({"keys": [...]}). Keys that do not parse or
// are not usable are skipped, so that an issuer's encryption keys do not
// spoil its signing keys; at least one usable key must remain.
func parseKeySet(b []byte) (*keySet, error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("not a JWKS: %w", err)
	}
	ks := &keySet{}
	for _, r := range raw.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(r); err != nil {
			continue
		}
		if pub, ok := usableKey(k); ok {
			ks.keys = append(ks.keys, pub)
		}
	}
	if len(ks.keys) == 0 {
		return nil, fmt.Errorf("none of its %d keys can verify tokens (RSA of %d bits or more, EC P-256 or Ed25519, use sig)",
			len(raw.Keys), minRSABits)
	}
	return ks, nil
}

// maxKeysWithoutKID bounds the keys a token without a kid is tried
// against.
const maxKeysWithoutKID = 8

// candidates are the keys a token of alg naming kid may be signed with;
// kidKnown reports whether the set holds kid at all (whatever its type).
// A token without a kid is tried against every key of its algorithm,
// when there are at most maxKeysWithoutKID.
func (ks *keySet) candidates(kid string, alg jose.SignatureAlgorithm) (keys []jose.JSONWebKey, kidKnown bool) {
	for _, k := range ks.keys {
		if kid != "" && k.KeyID != kid {
			continue
		}
		kidKnown = kidKnown || kid != ""
		if keyAlg(k) == alg {
			keys = append(keys, k)
		}
	}
	return keys, kidKnown
}

func (ks *keySet) hasKID(kid string) bool {
	for _, k := range ks.keys {
		if k.KeyID == kid {
			return true
		}
	}
	return false
}

// jwks holds a jwt source's keys: from its jwks_url, fetched when first
// needed, again in the background once older than refresh, and when a
// token names a kid the set lacks; or from its jwks_file, read again when
// the file's modification time or size changes (looked at once a second at
// most) and on SIGHUP.
//
// Fetches of the url are single and bounded: one at a time, whatever asks
// for it, each within jwksFetchTimeout; the next one no sooner than
// minInterval after the last ended, and after a failure no sooner than a
// backoff (internal/backoff) that doubles with each failure in a row, up
// to maxJWKSBackoff.
// A request that needs a fetch (no keys yet, or an unknown kid) waits for
// the one in flight for as long as its own context allows, never for a
// second one; a token whose kid is in hand never waits. A load that fails
// keeps the keys in hand.
type jwks struct {
	source      string // the source's name, for logs
	url         string
	file        string
	client      *http.Client
	refresh     time.Duration
	minInterval time.Duration
	log         *slog.Logger
	now         func() time.Time

	set atomic.Pointer[keySet]
	// fileLooked is when (Unix ns) the file was last looked at: at most
	// once per fileLookInterval, not on every request.
	fileLooked atomic.Int64
	mu         sync.Mutex // guards the fields below; never held across a fetch
	inflight   *flight    // the fetch under way, if any
	next       time.Time  // no fetch starts before
	failures   int        // fetches failed in a row
	bad        fileStamp  // the file's last version that did not load
}

// flight is one fetch of a jwks_url; done is closed when it ends, after
// failed is set.
type flight struct {
	done   chan struct{}
	failed bool
}

// maxJWKSBackoff bounds the wait after fetches that failed in a row.
const maxJWKSBackoff = 5 * time.Minute

func newJWKS(s *Source, log *slog.Logger, now func() time.Time) *jwks {
	j := &jwks{source: s.Name, url: s.JWKSURL, file: s.JWKSFile, refresh: s.JWKSRefresh, minInterval: s.JWKSMinInterval,
		log: log, now: now}
	if j.url != "" {
		j.client = &http.Client{
			Timeout: jwksFetchTimeout,
			Transport: &http.Transport{
				Proxy:                 http.ProxyFromEnvironment,
				DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
				TLSHandshakeTimeout:   5 * time.Second,
				ResponseHeaderTimeout: jwksFetchTimeout,
				MaxIdleConnsPerHost:   1,
				IdleConnTimeout:       90 * time.Second,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return j
}

// where names the keys' origin for logs and errors.
func (j *jwks) where() string {
	if j.file != "" {
		return "jwks_file " + j.file
	}
	if u, err := url.Parse(j.url); err == nil {
		return "jwks_url " + u.Redacted()
	}
	return "jwks_url"
}

// keys returns the set to verify a token naming kid with (nil when there
// is none at all), and whether the set could not be brought up to date
// for it: the fetch it needed failed, was held back after a failure, or
// did not end before ctx did.
func (j *jwks) keys(ctx context.Context, kid string) (ks *keySet, unavailable bool) {
	ks = j.set.Load()
	if j.file != "" {
		if ks == nil || j.fileDue() && j.fileChanged(ks) {
			ks = j.loadFile(false)
		}
		return ks, false
	}
	if ks != nil && (kid == "" || ks.hasKID(kid)) {
		if j.now().Sub(ks.at) >= j.refresh {
			j.start(false)
		}
		return ks, false
	}
	// No keys yet, or a rotation at the issuer: its new key is not
	// known yet.
	f, failed := j.start(true)
	if f == nil {
		return j.set.Load(), failed
	}
	select {
	case <-f.done:
		return j.set.Load(), f.failed
	case <-ctx.Done():
		return j.set.Load(), true
	}
}

// retryIn is how long until the next fetch may start (at least a second).
func (j *jwks) retryIn() time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	return max(j.next.Sub(j.now()), time.Second)
}

// start returns the fetch in flight, or starts one when none is and the
// last ended long enough ago. It returns nil when no fetch is to be waited
// for, with whether the last one failed. Without wait, a fetch that is
// started runs in the background.
func (j *jwks) start(wait bool) (f *flight, lastFailed bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.inflight != nil {
		if !wait {
			return nil, false
		}
		return j.inflight, false
	}
	if j.now().Before(j.next) {
		return nil, j.failures > 0
	}
	f = &flight{done: make(chan struct{})}
	j.inflight = f
	// The fetch is nobody's request: a caller that gives up or hangs up
	// does not cut it short (others wait on it); jwksFetchTimeout does.
	go j.run(f, j.set.Load())
	return f, false
}

// run makes fetch f and records its outcome.
func (j *jwks) run(f *flight, seen *keySet) {
	ks, err := j.get(context.Background())
	now := j.now()
	j.mu.Lock()
	if err == nil {
		ks.at = now
		j.set.Store(ks)
		j.failures = 0
		j.next = now.Add(j.minInterval)
	} else {
		j.failures++
		// Never sooner than after a success; then doubling, jittered.
		j.next = now.Add(max(j.minInterval, backoff.Policy{Min: j.minInterval, Max: maxJWKSBackoff}.Delay(j.failures-1)))
	}
	next := j.next
	j.inflight = nil
	j.mu.Unlock()
	f.failed = err != nil
	close(f.done)
	switch {
	case err == nil:
		j.log.Info("webhook: JWKS loaded", logkey.Source, j.source, "jwks", j.where(), "keys", len(ks.keys))
	case seen != nil:
		j.log.Warn("webhook: cannot fetch the JWKS; keeping the keys in hand", logkey.Source, j.source,
			"jwks", j.where(), "keys_age", now.Sub(seen.at).Round(time.Second).String(),
			"next_fetch_in", next.Sub(now).Round(time.Second).String(), logkey.Err, err)
	default:
		j.log.Error("webhook: cannot fetch the JWKS; the source's tokens are refused until it can", logkey.Source, j.source,
			"jwks", j.where(), "next_fetch_in", next.Sub(now).Round(time.Second).String(), logkey.Err, err)
	}
}

// prefetch loads the url's keys when none are in hand (at start, so that
// an unreachable issuer is reported at once); it waits until the fetch
// ends or ctx does.
func (j *jwks) prefetch(ctx context.Context) {
	if j.url == "" || j.set.Load() != nil {
		return
	}
	if f, _ := j.start(true); f != nil {
		select {
		case <-f.done:
		case <-ctx.Done():
		}
	}
}

func (j *jwks) get(ctx context.Context) (*keySet, error) {
	ctx, cancel := context.WithTimeout(ctx, jwksFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	req.Header.Set("User-Agent", "vgpu-bridge-jwks")
	resp, err := j.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which where() names redacted
		}
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // reuse the connection
		return nil, fmt.Errorf("answered %s (redirects are not followed)", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(b) > maxJWKSBytes {
		return nil, fmt.Errorf("the answer is larger than %d bytes", maxJWKSBytes)
	}
	return parseKeySet(b)
}

// readJWKSFile reads and parses a jwks_file.
func readJWKSFile(path string) (*keySet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxJWKSBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxJWKSBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxJWKSBytes)
	}
	ks, err := parseKeySet(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ks.stamp = fileStamp{mod: fi.ModTime(), size: fi.Size()}
	return ks, nil
}

// fileLookInterval is the least time between two looks at a jwks_file
// (a stat; a file whose new version does not load would otherwise be
// looked at, under the lock, by every request).
const fileLookInterval = time.Second

// fileDue reports whether the file is to be looked at now, and if so
// claims the look.
func (j *jwks) fileDue() bool {
	now := j.now().UnixNano()
	last := j.fileLooked.Load()
	return now-last >= int64(fileLookInterval) && j.fileLooked.CompareAndSwap(last, now)
}

// fileChanged reports whether the file is not the version ks was read
// from. A file that cannot be looked at has not changed: the keys in hand
// stay.
func (j *jwks) fileChanged(ks *keySet) bool {
	fi, err := os.Stat(j.file)
	return err == nil && !ks.stamp.equal(fileStamp{mod: fi.ModTime(), size: fi.Size()})
}

// loadFile reads the file again when it changed (or always, with force)
// and returns the set then in hand. A version that does not load is not
// tried again until the file changes.
func (j *jwks) loadFile(force bool) *keySet {
	j.mu.Lock()
	defer j.mu.Unlock()
	cur := j.set.Load()
	if !force {
		fi, err := os.Stat(j.file)
		if err == nil {
			st := fileStamp{mod: fi.ModTime(), size: fi.Size()}
			if (cur != nil && cur.stamp.equal(st)) || j.bad.equal(st) {
				return cur
			}
		} else if cur != nil {
			return cur
		}
	}
	ks, err := readJWKSFile(j.file)
	if err != nil {
		if fi, serr := os.Stat(j.file); serr == nil {
			j.bad = fileStamp{mod: fi.ModTime(), size: fi.Size()}
		}
		j.log.Warn("webhook: cannot read the JWKS; keeping the keys in hand", logkey.Source, j.source,
			"jwks", j.where(), "have_keys", cur != nil, logkey.Err, err)
		return cur
	}
	ks.at = j.now()
	j.set.Store(ks)
	j.bad = fileStamp{}
	j.log.Info("webhook: JWKS loaded", logkey.Source, j.source, "jwks", j.where(), "keys", len(ks.keys))
	return ks
}
