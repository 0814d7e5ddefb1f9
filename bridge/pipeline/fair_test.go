package pipeline

import (
	"slices"
	"testing"
)

// The projects take turns; an instance's events go one at a time and in
// order; a dropped instance's events leave the turns.
func TestTurns(t *testing.T) {
	s := newTurns(25)
	for _, c := range []struct {
		project string
		id      int64
		inst    string
	}{
		{"a", 1, "x"}, {"a", 2, "x"}, {"a", 3, "y"}, {"a", 4, "z"}, {"a", 5, "z"},
		{"b", 10, "q"}, {"b", 11, "r"},
		{"", 20, ""}, {"", 21, ""},
		{"a", 1, "x"}, // seen: not queued twice
	} {
		s.add(candidate{id: c.id, instance: c.inst, project: c.project})
	}
	if s.queued != 9 {
		t.Fatalf("queued = %d, want 9", s.queued)
	}
	take := func(n int) []int64 {
		var out []int64
		for range n {
			c, ok := s.next()
			if !ok {
				break
			}
			out = append(out, c.id)
		}
		return out
	}
	// a, b, "" in turns; x's second event waits for its first.
	if got, want := take(5), []int64{1, 10, 20, 3, 11}; !slices.Equal(got, want) {
		t.Fatalf("first turns = %v, want %v", got, want)
	}
	s.finished(candidate{id: 1, instance: "x", project: "a"}, true)
	if got, want := take(2), []int64{21, 2}; !slices.Equal(got, want) {
		t.Fatalf("next turns = %v, want %v", got, want)
	}
	// z's first event, then z is busy: nothing else can go.
	if got, want := take(3), []int64{4}; !slices.Equal(got, want) {
		t.Fatalf("then = %v, want %v", got, want)
	}
	s.finished(candidate{id: 4, instance: "z", project: "a"}, false)
	s.drop("z") // 4 was not decided: 5 waits for the next call
	if _, ok := s.next(); ok || s.queued != 0 {
		t.Fatalf("after the drop: %d queued, want none", s.queued)
	}
	// What is held counts against a project's share: queued or being
	// decided (2, 3, 10, 11, 20, 21 were taken and not finished).
	for proj, want := range map[string]int{"a": 2, "b": 2, "": 2} {
		if got := s.projects[proj].held; got != want {
			t.Errorf("project %q holds %d, want %d", proj, got, want)
		}
	}
	if s.projects["a"].last != 5 || !s.seen[5] || s.seen[1] {
		t.Errorf("a: last %d, seen 5 %v, seen 1 %v; want 5, true (dropped), false (closed)", s.projects["a"].last, s.seen[5], s.seen[1])
	}
	// What was given up on may come back after a full look.
	if !s.dropped[4] || !s.dropped[5] || len(s.dropped) != 2 {
		t.Errorf("dropped = %v, want 4 and 5", s.dropped)
	}
}
