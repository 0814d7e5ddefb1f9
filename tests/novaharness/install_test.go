package novaharness

import (
	"context"
	"strings"
	"testing"
)

// TestMissingNovaNamesInstall: without the interpreter or one of the
// modules the harness fails with the command that installs them.
func TestMissingNovaNamesInstall(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name, python string
		modules      []string
		want         string
	}{
		{"no interpreter", "/nonexistent/python3", novaModules, "/nonexistent/python3 is missing"},
		{"no module", Python, []string{"json", "nova_not_installed_here"}, "missing Python modules: nova_not_installed_here"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkInstalled(ctx, tt.python, tt.modules)
			if err == nil {
				t.Fatal("checkInstalled passed")
			}
			for _, want := range []string{tt.want, "make services", "python3-nova python3-wsgi-intercept"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	if err := checkInstalled(ctx, Python, novaModules); err != nil {
		t.Errorf("on this machine: %v", err)
	}
}
