package bridge

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func TestReloadTokensAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(tokens, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("token-one-0123456789 admin ops\n")
	load := func(extra ...string) *conf.Values {
		t.Helper()
		v, err := LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.transport_url=rabbit://u:p@127.0.0.1:5672/",
			"database.connection=postgres://u@127.0.0.1/db", "api.token_file=" + tokens}, extra...)})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := load()
	ac, err := APIConfig(v)
	if err != nil {
		t.Fatal(err)
	}
	r := newReloader(v, prometheus.NewRegistry(), nil)
	r.api(v, &ac)
	auth := func(tok string) bool {
		req, _ := http.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Auth-Token", tok)
		_, err := ac.Auth.Authenticate(req)
		return err == nil
	}
	tests := []struct {
		name      string
		file      string
		extra     []string
		wantErr   string
		accepted  []string
		refused   []string
		wantRetry []string
	}{
		{name: "new token", file: "token-two-0123456789 admin ops\n",
			accepted: []string{"token-two-0123456789"}, refused: []string{"token-one-0123456789"}},
		{name: "bad file keeps the tokens in use", file: "token-three-0123456789 superuser\n", wantErr: "token_file",
			accepted: []string{"token-two-0123456789"}, refused: []string{"token-three-0123456789"}},
		{name: "listen needs a restart", file: "token-four-0123456789 reader\n", extra: []string{"api.listen=127.0.0.1:1"},
			accepted: []string{"token-four-0123456789"}, refused: []string{"token-two-0123456789"}, wantRetry: []string{"[api] listen"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			write(tc.file)
			nv := load(tc.extra...)
			s, serr := r.stage(nv)
			err := r.reload(nv)
			if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("reload: %v, want error %q", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "token-three") {
				t.Errorf("the error shows the token: %v", err)
			}
			for _, tok := range tc.accepted {
				if !auth(tok) {
					t.Errorf("%s refused", tok)
				}
			}
			for _, tok := range tc.refused {
				if auth(tok) {
					t.Errorf("%s accepted", tok)
				}
			}
			if serr == nil && strings.Join(s.restarts, ",") != strings.Join(tc.wantRetry, ",") {
				t.Errorf("needs restart %v, want %v", s.restarts, tc.wantRetry)
			}
		})
	}
}
