package webhook

import (
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
// sources (SIGHUP reload) without stopping the endpoint: requests
// authenticated from then on, and callbacks signed from then on, use the
// new ones. Only credentials change: sources must be the same names
// with the same auth as at start (anything else needs a restart). Every
// source is checked (CheckCredentials) before any is changed, so a bad
// set changes nothing.
func (e *Endpoint) SetCredentials(sources []Source) error {
	if err := e.CheckCredentials(sources); err != nil {
		return err
	}
	for _, s := range sources {
		e.sources[s.Name].creds.Store(newCredentials(s.Secrets, s.Tokens))
	}
	return nil
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
		}
	}
	if len(byName) != len(sources) {
		errs = append(errs, errors.New("a source is named twice"))
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}
