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
