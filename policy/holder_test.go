package policy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

const ruleA = "rules:\n  - {name: a, on: [alert], then: ['notify(\"a\")']}\n"
const ruleB = "rules:\n  - {name: b, on: [alert], then: ['notify(\"b\")']}\n"

func TestHolderReloadKeepsOldPolicyOnError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, ruleA)
	h, err := NewHolder(Config{RulesFile: path, ProfilesFile: "testdata/profiles.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Policy().Rules(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("rules = %v", got)
	}
	writeFile(t, path, "rules:\n  - {name: broken, on: [alert], when: 'event.nope', then: [release()]}\n")
	err = h.Reload()
	if err == nil || !strings.Contains(err.Error(), `rule "broken": when: undefined field 'nope'`) {
		t.Fatalf("Reload error = %v", err)
	}
	if got := h.Policy().Rules(); got[0] != "a" {
		t.Errorf("broken file replaced the policy: %v", got)
	}
	if r, f, last := h.Stats(); r != 1 || f != 1 || !strings.Contains(last, "broken") {
		t.Errorf("stats %d %d %q", r, f, last)
	}
	writeFile(t, path, ruleB)
	if err := h.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := h.Policy().Rules(); got[0] != "b" {
		t.Errorf("rules = %v", got)
	}
	// Observed profiles survive a reload: the catalog is the holder's.
	if _, err := h.Catalog().Observe("nvidia-999", "GRID T4-2Q", 8); err != nil {
		t.Fatal(err)
	}
	if err := h.Reload(); err != nil {
		t.Fatal(err)
	}
	if p, _ := h.Policy().Catalog().ByTrait("CUSTOM_NVIDIA_999"); p.Name != "T4-2Q" {
		t.Errorf("observed profile lost: %+v", p)
	}
}

func TestNewHolderFailsOnBrokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, "rules: [\n")
	if _, err := NewHolder(Config{RulesFile: path}, nil); err == nil {
		t.Fatal("no error")
	}
}

func TestWatchReloadsOnChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, ruleA)
	h, err := NewHolder(Config{RulesFile: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Watch(ctx, 5*time.Millisecond, nil); close(done) }()
	defer func() { cancel(); <-done }()

	wait := func(cond func() bool, what string) {
		t.Helper()
		for i := 0; i < 1000; i++ {
			if cond() {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	// Broken content: refused, counted, old policy stays.
	writeFile(t, path, "rules: [\n")
	os.Chtimes(path, time.Now().Add(time.Second), time.Now().Add(time.Second))
	wait(func() bool { _, f, _ := h.Stats(); return f == 1 }, "the failed reload")
	if h.Policy().Rules()[0] != "a" {
		t.Fatal("old policy not kept")
	}
	writeFile(t, path, ruleB)
	os.Chtimes(path, time.Now().Add(2*time.Second), time.Now().Add(2*time.Second))
	wait(func() bool { return h.Policy().Rules()[0] == "b" }, "the reload")
	// Same content, new mtime: no reload.
	r, _, _ := h.Stats()
	os.Chtimes(path, time.Now().Add(3*time.Second), time.Now().Add(3*time.Second))
	time.Sleep(50 * time.Millisecond)
	if r2, _, _ := h.Stats(); r2 != r {
		t.Errorf("reloaded unchanged content: %d -> %d", r, r2)
	}
}

// TestReloadRefusesEmptyFile: a rules file caught empty (truncated by an
// in-place write that has not finished) is refused; the old policy stays.
func TestReloadRefusesEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, ruleA)
	h, err := NewHolder(Config{RulesFile: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, empty := range []string{"", " \n\t\n"} {
		writeFile(t, path, empty)
		if err := h.Reload(); err == nil || !strings.Contains(err.Error(), "empty") {
			t.Errorf("reload of %q: %v, want an empty-file error", empty, err)
		}
		if r := h.Policy().Rules(); len(r) != 1 || r[0] != "a" {
			t.Errorf("active rules after %q: %v, want [a]", empty, r)
		}
	}
}
