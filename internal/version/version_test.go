package version

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	s := String("vgpu-bridge")
	if !strings.HasPrefix(s, "vgpu-bridge "+Version()+" (commit "+Commit()+", go") {
		t.Errorf("String = %q", s)
	}
	if Version() == "" || Commit() == "" {
		t.Errorf("empty version %q or commit %q", Version(), Commit())
	}
}
