package conf

import (
	"strings"
	"testing"
)

// TestStrict: a misspelt option, section or environment variable is an
// error naming the nearest valid one, reported with the other errors;
// before, each was a warning and the default was used in its place.
func TestStrict(t *testing.T) {
	s, _, _, _, _, _, _ := testSet()
	file := writeFile(t, "[database]\nmax_conections = 4\n[api]\nmax_connections = 2\nread_timeout = 5s\n[databse]\nconnection = x\n"+
		"[webhook_sorce:a]\nauth = hmac\n[webhook_source:b]\nauth = hmac\nrat = 3\n")
	_, err := s.Load(Source{File: file, Environ: []string{"VGPU_TEST_DATABASE_MAX_CONECTIONS=3", "VGPU_TEST_API_READ_TIMEOUT=9s"},
		Overrides: []string{"api.read_timout=1s"}})
	es, ok := AsErrors(err)
	if !ok {
		t.Fatalf("Load: %v, want Errors", err)
	}
	got := es.Error()
	for _, want := range []string{
		`[database] max_conections = "4": no such option; did you mean max_connections?`,
		`[api] max_connections = "2": no such option; it is an option of [database]`,
		`[databse]: no such section; did you mean [database]?`,
		`[webhook_sorce:a]: no such section; did you mean [webhook_source:NAME]?`,
		`[webhook_source:b] rat = "3": no such option in [webhook_source:*] sections`,
		`[environment] VGPU_TEST_DATABASE_MAX_CONECTIONS = "": names no option; did you mean VGPU_TEST_DATABASE_MAX_CONNECTIONS?`,
		`[api] read_timout = "1s": no such option; did you mean read_timeout?`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("errors lack %s\n%s", want, got)
		}
	}
	if strings.Contains(got, "read_timeout = \"5s\"") || strings.Contains(got, "API_READ_TIMEOUT") {
		t.Errorf("a valid setting reported:\n%s", got)
	}
}

// TestDeprecated: a renamed option is still read, into its new name, with
// a warning; a removed one is ignored with a warning; the new name wins
// when both are set.
func TestDeprecated(t *testing.T) {
	s, _, n, d, _, _, _ := testSet()
	s.Deprecated("database", "pool_size", "database", "max_connections")
	s.Deprecated("api", "old_knob", "", "")
	v, err := s.Load(Source{File: writeFile(t, "[database]\npool_size = 7\n[api]\nold_knob = 1\n"),
		Environ: []string{"VGPU_TEST_DATABASE_POOL_SIZE=9"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Get(v); got != 9 {
		t.Errorf("max_connections = %d, want 9 (the old name's environment variable)", got)
	}
	if len(v.Warnings) != 3 || !strings.Contains(strings.Join(v.Warnings, "\n"), "[database] pool_size is deprecated; use [database] max_connections") ||
		!strings.Contains(strings.Join(v.Warnings, "\n"), "[api] old_knob was removed") {
		t.Errorf("warnings %q", v.Warnings)
	}
	v, err = s.Load(Source{File: writeFile(t, "[database]\nmax_connections = 5\npool_size = 7\n")})
	if err != nil || n.Get(v) != 5 {
		t.Errorf("both names set: %d, %v; want the new name's 5", n.Get(v), err)
	}
	_ = d
}
