package bridge

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/novaresize"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// TestDefaultConfigsAreTheOptionsDefaults: a feature package that declares
// its options gives as its DefaultConfig what the bridge maps from a file
// that sets nothing, so each default is written once, in its declaration.
func TestDefaultConfigsAreTheOptionsDefaults(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "bridge.conf")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := Options().Load(conf.Source{File: empty})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		feature   string
		got, want any
	}{
		{"pipeline", PipelineConfig(v, ""), pipeline.DefaultConfig()},
		{"ingest", ingest.ConfigFrom(v), ingest.DefaultConfig()},
		{"dispatch", dispatch.ConfigFrom(v), dispatch.DefaultConfig()},
		{"drift", DriftConfig(v, ""), drift.DefaultConfig()},
		{"webhook", webhook.ConfigFrom(v), func() webhook.Config {
			c := webhook.DefaultConfig()
			c.CommitTimeout, c.MaxClients, c.Callbacks.Lease, c.Callbacks.Parallel = 0, 0, 0, 0
			return c
		}()},
		{"novaresize", novaresize.ConfigFrom(v), func() novaresize.Config { c := novaresize.DefaultConfig(); c.CallLease = 0; return c }()},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: from an empty file\n%+v\nDefaultConfig\n%+v", c.feature, c.got, c.want)
		}
	}
}
