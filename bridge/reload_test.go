package bridge

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
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
	policyFile := filepath.Join(dir, "access.yaml")
	if err := os.WriteFile(policyFile, []byte("\"vgpu:hosts:drain\": \"rule:admin or role:vgpu-maintainer\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
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
		// The access rules are read again, from a new path too.
		{name: "access policy file applies", file: "token-four-0123456789 reader\n", extra: []string{"oslo_policy.policy_file=" + policyFile},
			accepted: []string{"token-four-0123456789"}},
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
	// The rules in force are the file's, read again on each reload: an edit
	// in place applies; a file that does not compile is refused and the
	// rules in use stay.
	const drain = "vgpu:hosts:drain"
	if got := ac.Policy.Rule(drain); got != "(rule:admin or role:vgpu-maintainer)" && got != "rule:admin or role:vgpu-maintainer" {
		t.Errorf("after the reload %s is %q, want the file's", drain, got)
	}
	if err := os.WriteFile(policyFile, []byte("\"vgpu:hosts:drain\": \"rule:admin or role:drainer\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withFile := load("oslo_policy.policy_file=" + policyFile)
	if err := r.reload(withFile); err != nil {
		t.Fatal(err)
	}
	if got := ac.Policy.Rule(drain); !strings.Contains(got, "role:drainer") {
		t.Errorf("after an edit in place and SIGHUP %s is %q, want the edited rule", drain, got)
	}
	if err := os.WriteFile(policyFile, []byte("\"vgpu:hosts:drian\": \"role:x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.reload(withFile); err == nil || !strings.Contains(err.Error(), "vgpu:hosts:drian") {
		t.Errorf("a file naming no rule reloaded: %v, want it refused naming the rule", err)
	}
	if got := ac.Policy.Rule(drain); !strings.Contains(got, "role:drainer") {
		t.Errorf("after a refused reload %s is %q, want the rules in use kept", drain, got)
	}
}

// TestReloadReportsEveryChangedOption: a SIGHUP that changes an option a
// reload does not apply ([policy] rules_file, a rate, a webhook source's
// rate) says so, at warning level and by name ("changed; needs a
// restart"), instead of logging a plain success; options it applies (the
// token file) and options left as they were are not reported.
func TestReloadReportsEveryChangedOption(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("token-one-0123456789 admin ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens2 := filepath.Join(dir, "tokens2")
	if err := os.WriteFile(tokens2, []byte("token-two-0123456789 admin ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(extra ...string) *conf.Values {
		t.Helper()
		v, err := LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.transport_url=rabbit://u:p@127.0.0.1:5672/",
			"database.connection=postgres://u@127.0.0.1/db"}, extra...)})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := load("api.token_file="+tokens, "policy.rules_file=/etc/vgpu-bridge/rules.yaml")
	ac, err := APIConfig(v)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	r := newReloader(v, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	r.api(v, &ac)
	nv := load("api.token_file="+tokens2, "policy.rules_file=/etc/vgpu-bridge/rules-v2.yaml", "dispatch.reconnect_max=1m")
	if err := r.reload(nv); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"[policy] rules_file", "[dispatch] reconnect_max"} {
		if !strings.Contains(logs.String(), "level=WARN msg=\""+name+" changed; needs a restart") {
			t.Errorf("no warning naming %s:\n%s", name, logs.String())
		}
	}
	if strings.Contains(logs.String(), "[api] token_file changed; needs a restart") {
		t.Errorf("the applied token_file is reported as needing a restart:\n%s", logs.String())
	}
	if s, _ := r.stage(nv); strings.Join(s.restarts, ",") != "[dispatch] reconnect_max,[policy] rules_file" {
		t.Errorf("needs restart %v", s.restarts)
	}
}

// TestReloadAppliesNewRulesFile: a SIGHUP that names another [policy]
// rules_file reads the new path (not the old file again); a new path whose
// file is broken refuses the reload, and the policy in use stays.
func TestReloadAppliesNewRulesFile(t *testing.T) {
	etc, err := filepath.Abs("../etc/vgpu-bridge")
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(etc, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	v2 := filepath.Join(dir, "rules-v2.yaml")
	if err := os.WriteFile(v2, append(append([]byte(nil), shipped...), []byte("\n# v2\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte("rules: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	load := func(rules string) *conf.Values {
		t.Helper()
		v, err := LoadConfig(conf.Source{Overrides: []string{"DEFAULT.transport_url=rabbit://u:p@127.0.0.1:5672/",
			"database.connection=postgres://u@127.0.0.1/db", "api.auth_strategy=noauth", "policy.rules_file=" + rules,
			"policy.profiles_file=" + filepath.Join(etc, "profiles.yaml"), "policy.driver_compat_file=" + filepath.Join(etc, "driver-compat.yaml")}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := load(filepath.Join(etc, "rules.yaml"))
	h, err := policy.NewHolder(PolicyConfig(v), nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	r := newReloader(v, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	r.setPolicy(h)
	if err := r.reload(load(broken)); err == nil || !strings.Contains(err.Error(), "rules_file") {
		t.Errorf("reload with a broken new rules file: %v, want refused naming rules_file", err)
	}
	if h.RulesFile() != filepath.Join(etc, "rules.yaml") {
		t.Errorf("rules file in use %s after a refused reload", h.RulesFile())
	}
	if err := r.reload(load(v2)); err != nil {
		t.Fatal(err)
	}
	if h.RulesFile() != v2 {
		t.Errorf("rules file in use %s, want the new path %s", h.RulesFile(), v2)
	}
	if strings.Contains(logs.String(), "rules_file changed; needs a restart") {
		t.Errorf("an applied rules_file is reported as needing a restart:\n%s", logs.String())
	}
}
