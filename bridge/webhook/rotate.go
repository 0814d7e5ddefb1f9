package webhook

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
)

// credentials are a source's secrets and tokens, replaced as a whole.
type credentials struct {
	secrets   [][]byte
	tokens    []string
	tokenSums [][32]byte
}

func newCredentials(secrets [][]byte, tokens []string) *credentials {
	c := &credentials{secrets: secrets, tokens: tokens}
	for _, t := range tokens {
		c.tokenSums = append(c.tokenSums, sha256.Sum256([]byte(t)))
	}
	return c
}

// credentials returns the credentials in use (the configured ones for a
// source built without New).
func (s *source) credentials() *credentials {
	if c := s.creds.Load(); c != nil {
		return c
	}
	return newCredentials(s.cfg.Secrets, s.cfg.Tokens)
}

// current is the source's configuration with the credentials in use.
func (s *source) current() Source {
	c := s.credentials()
	out := s.cfg
	out.Secrets, out.Tokens = c.secrets, c.tokens
	return out
}

// SetCredentials replaces the HMAC secrets and bearer tokens of the
// sources (SIGHUP reload) without stopping the endpoint, and reads the
// jwks_file of jwt sources again: requests authenticated from then on,
// and callbacks signed from then on, use the new ones. Only credentials
// change: sources must be the same names with the same auth (and, for
// jwt, the same jwt_* and jwks_* settings) as at start (anything else
// needs a restart). Every source is checked (CheckCredentials) before any
// is changed, so a bad set changes nothing.
func (e *Endpoint) SetCredentials(sources []Source) error {
	if err := e.CheckCredentials(sources); err != nil {
		return err
	}
	for _, s := range sources {
		src := e.sources[s.Name]
		src.creds.Store(newCredentials(s.Secrets, s.Tokens))
		if src.jwt != nil && src.jwt.keys.file != "" {
			src.jwt.keys.loadFile(true)
		}
	}
	return nil
}

// jwtChange names the jwt setting of s that differs from the one in use
// by src ("" when none does).
func jwtChange(src Source, s Source) string {
	switch {
	case s.JWTIssuer != src.JWTIssuer:
		return "jwt_issuer"
	case cmp.Or(s.JWTAudience, DefaultJWTAudience(s.Name)) != src.JWTAudience:
		return "jwt_audience"
	case s.JWTMaxLifetime != 0 && s.JWTMaxLifetime != src.JWTMaxLifetime:
		return "jwt_max_lifetime"
	case s.JWKSURL != src.JWKSURL:
		return "jwks_url"
	case s.JWKSFile != src.JWKSFile:
		return "jwks_file"
	case s.JWTLeeway != src.JWTLeeway:
		return "jwt_leeway"
	case s.JWTProjectsClaim != src.JWTProjectsClaim:
		return "jwt_projects_claim"
	case s.JWKSRefresh != 0 && s.JWKSRefresh != src.JWKSRefresh:
		return "jwks_refresh_interval"
	}
	return ""
}

// CheckCredentials reports what SetCredentials would refuse in sources.
func (e *Endpoint) CheckCredentials(sources []Source) error {
	byName := make(map[string]Source, len(sources))
	for _, s := range sources {
		byName[s.Name] = s
	}
	var errs []error
	for name := range byName {
		if e.sources[name] == nil {
			errs = append(errs, fmt.Errorf("source %q is new: adding a source needs a restart", name))
		}
	}
	names := make([]string, 0, len(e.sources))
	for name := range e.sources {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s, ok := byName[name]
		src := e.sources[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("source %q is gone: removing a source needs a restart", name))
		case s.Auth != src.cfg.Auth:
			errs = append(errs, fmt.Errorf("source %q: changing auth from %s to %s needs a restart", name, src.cfg.Auth, s.Auth))
		case s.Auth == AuthHMAC && len(s.Secrets) == 0:
			errs = append(errs, fmt.Errorf("source %q: auth = hmac needs at least one secret", name))
		case s.Auth == AuthBearer && len(s.Tokens) == 0:
			errs = append(errs, fmt.Errorf("source %q: auth = bearer needs at least one token", name))
		case s.Auth == AuthJWT && jwtChange(src.cfg, s) != "":
			errs = append(errs, fmt.Errorf("source %q: changing %s needs a restart", name, jwtChange(src.cfg, s)))
		case s.Auth == AuthJWT && s.JWKSFile != "":
			if _, err := readJWKSFile(s.JWKSFile); err != nil {
				errs = append(errs, fmt.Errorf("source %q: jwks_file: %w", name, err))
			}
		}
	}
	if len(byName) != len(sources) {
		errs = append(errs, errors.New("a source is named twice"))
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}
