package bridge

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRulesFileDeprecatedDefault: the rules file left at its default is
// read from the old name only while the new one is absent.
func TestRulesFileDeprecatedDefault(t *testing.T) {
	dir := t.TempDir()
	def, old := filepath.Join(dir, "rules.yaml"), filepath.Join(dir, "policy.yaml")
	touch := func(p string) {
		if err := os.WriteFile(p, []byte("version: 1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(set, want string, wantDeprecated bool) {
		t.Helper()
		got, dep := rulesFile(set, def, old)
		if got != want || dep != wantDeprecated {
			t.Errorf("rulesFile(%s) = %s, %v; want %s, %v", set, got, dep, want, wantDeprecated)
		}
	}
	check(def, def, false) // neither exists: the default, whose absence the load reports
	touch(old)
	check(def, old, true)
	check("/srv/mine.yaml", "/srv/mine.yaml", false) // set explicitly: never second-guessed
	touch(def)
	check(def, def, false)
}
