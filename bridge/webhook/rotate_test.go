package webhook

import (
	"strings"
	"testing"
)

func TestSetCredentials(t *testing.T) {
	oldKey, newKey := []byte("old-secret-0123456789"), []byte("new-secret-0123456789")
	e := &Endpoint{sources: map[string]*source{}}
	for _, s := range []Source{{Name: "batch", Auth: AuthHMAC, Secrets: [][]byte{oldKey}},
		{Name: "alerts", Auth: AuthBearer, Tokens: []string{"old-token"}}} {
		src := &source{cfg: s}
		src.creds.Store(newCredentials(s.Secrets, s.Tokens))
		e.sources[s.Name] = src
	}
	good := []Source{{Name: "batch", Auth: AuthHMAC, Secrets: [][]byte{newKey}},
		{Name: "alerts", Auth: AuthBearer, Tokens: []string{"new-token"}}}
	tests := []struct {
		name    string
		sources []Source
		wantErr string
	}{
		{"new source", append(good, Source{Name: "other", Auth: AuthHMAC, Secrets: [][]byte{newKey}}), `source "other" is new`},
		{"source gone", good[:1], `source "alerts" is gone`},
		{"auth changed", []Source{good[0], {Name: "alerts", Auth: AuthHMAC, Secrets: [][]byte{newKey}}}, "changing auth"},
		{"no secret", []Source{{Name: "batch", Auth: AuthHMAC}, good[1]}, "needs at least one secret"},
		{"rotation", good, ""},
	}
	for _, tc := range tests {
		err := e.SetCredentials(tc.sources)
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
		}
		if tc.wantErr != "" && string(e.sources["batch"].current().Secrets[0]) != string(oldKey) {
			t.Errorf("%s: a refused set changed the secrets", tc.name)
		}
	}
	if c := e.sources["batch"].current(); string(c.Secrets[0]) != string(newKey) {
		t.Errorf("secrets after the rotation: %q", c.Secrets)
	}
	if !anyEqual([][]byte{e.sources["alerts"].credentials().tokenSums[0][:]}, [][]byte{newCredentials(nil, []string{"new-token"}).tokenSums[0][:]}) {
		t.Error("tokens after the rotation are not the new ones")
	}
}

// TestJWTReloadDefaults: a reload of a jwt source as configured (no
// jwt_audience: its default) changes nothing that needs a restart; another
// audience or lifetime does.
func TestJWTReloadDefaults(t *testing.T) {
	raw := Source{Name: "idp", Auth: AuthJWT, JWTIssuer: "https://idp.example.org", JWKSURL: "https://idp.example.org/certs",
		JWTMaxLifetime: DefaultJWTMaxLifetime, Rate: 1, Burst: 1}
	in := raw
	if err := checkSource(&in); err != nil {
		t.Fatal(err)
	}
	e := &Endpoint{sources: map[string]*source{"idp": {cfg: in}}}
	if err := e.CheckCredentials([]Source{raw}); err != nil {
		t.Errorf("the same source again: %v", err)
	}
	for opt, mod := range map[string]func(*Source){
		"jwt_audience":     func(s *Source) { s.JWTAudience = "other" },
		"jwt_max_lifetime": func(s *Source) { s.JWTMaxLifetime = 2 * DefaultJWTMaxLifetime },
	} {
		s := raw
		mod(&s)
		if err := e.CheckCredentials([]Source{s}); err == nil || !strings.Contains(err.Error(), "changing "+opt+" needs a restart") {
			t.Errorf("%s changed: %v", opt, err)
		}
	}
}
