package requests

import "testing"

func TestAllowed(t *testing.T) {
	all := []State{Accepted, Decided, Dispatched, Succeeded, Failed, Rejected}
	want := map[[2]State]bool{
		{Accepted, Accepted}: true, {Accepted, Decided}: true, {Accepted, Failed}: true, {Accepted, Rejected}: true,
		{Decided, Decided}: true, {Decided, Dispatched}: true, {Decided, Failed}: true, {Decided, Rejected}: true,
		{Dispatched, Dispatched}: true, {Dispatched, Succeeded}: true, {Dispatched, Failed}: true, {Dispatched, Rejected}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := Allowed(from, to); got != want[[2]State{from, to}] {
				t.Errorf("Allowed(%s, %s) = %v", from, to, got)
			}
		}
	}
	for _, s := range all {
		if s.Final() != (s == Succeeded || s == Failed || s == Rejected) {
			t.Errorf("%s.Final() = %v", s, s.Final())
		}
	}
	if State("paused").Valid() {
		t.Error("unknown state valid")
	}
}

func TestSourceName(t *testing.T) {
	for in, want := range map[string]string{"webhook:batch": "batch", "nova": "nova", "webhook:": "webhook:"} {
		if got := SourceName(in); got != want {
			t.Errorf("SourceName(%q) = %q, want %q", in, got, want)
		}
	}
}
