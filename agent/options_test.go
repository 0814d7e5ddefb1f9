package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/executor"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// TestFeatureDefaultsAreTheOptionsDefaults: what the agent maps from a
// file that sets nothing is what each package's own declarations give
// (the defaults its zero fields take), so each default is written once.
func TestFeatureDefaultsAreTheOptionsDefaults(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "agent.conf")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := Options().Load(conf.Source{File: empty})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pkg       string
		got, want any
	}{
		{"executor", executor.ConfigFrom(v), executor.ConfigFrom(conf.Defaults(executor.Options()))},
		{"journal", journal.OptionsFrom(v), journal.OptionsFrom(conf.Defaults(journal.OptionGroup()))},
		{"transport", transport.ConfigFrom(v), transport.ConfigFrom(conf.Defaults(transport.Options()))},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: from an empty file\n%+v\nfrom its declarations\n%+v", c.pkg, c.got, c.want)
		}
	}
}
