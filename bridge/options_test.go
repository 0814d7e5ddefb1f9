package bridge

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/maintenance"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/novaresize"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// TestDefaultConfigsAreTheOptionsDefaults: a feature package that declares
// its options gives as its DefaultConfig (the values its zero fields
// take) what the bridge maps from a file that sets nothing, so each
// default is written once, in its declaration. Every section whose
// options fill a feature's Config is here.
func TestDefaultConfigsAreTheOptionsDefaults(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "bridge.conf")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Where Placement is and how callers authenticate have no default
	// that the features' Configs hold; set them to reach the mappings.
	v, err := Options().Load(conf.Source{File: empty, Overrides: []string{"openstack.cloud=lab", "api.auth_strategy=noauth"}})
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
		{"placement", placementConfigOf(t, v), placement.DefaultConfig()},
		{"keystone", keystoneauth.ConfigFrom(v), keystoneauth.DefaultConfig()},
		{"api", func() api.Config {
			c := apiConfigOf(t, v)
			if c.Policy == nil || len(c.Policy.Overridden()) != 0 {
				t.Errorf("api: the access policy of an empty file is %v, want the defaults", c.Policy)
			}
			c.Listen, c.Auth, c.Policy = "", nil, nil
			return c
		}(), api.DefaultConfig()},
		{"oslo_messaging_notifications", NotifyConfig(v), func() notify.Config {
			c := notify.DefaultConfig()
			c.ReconnectMin, c.ReconnectMax = amqpconn.DefaultBackoff.Min, amqpconn.DefaultBackoff.Max
			return c
		}()},
		{"nova", func() computeapi.Config { c, _, _ := NovaConfig(v); c.Cloud, c.WrapTransport = "", nil; return c }(), computeapi.DefaultConfig()},
		{"maintenance", MaintenanceRunConfig(v), maintenance.DefaultRunConfig()},
		{"retention", RetentionConfig(v), controls.DefaultRetention()},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: from an empty file\n%+v\nDefaultConfig\n%+v", c.feature, c.got, c.want)
		}
	}
}

// placementConfigOf is what the bridge maps from v, less how it reaches
// Placement (which has no default).
func placementConfigOf(t *testing.T, v *conf.Values) placement.Config {
	t.Helper()
	c, err := PlacementConfig(v, "")
	if err != nil {
		t.Fatal(err)
	}
	c.Client = placement.ClientConfig{Microversion: c.Client.Microversion, Timeout: c.Client.Timeout}
	return c
}

// apiConfigOf is what the bridge maps from v.
func apiConfigOf(t *testing.T, v *conf.Values) api.Config {
	t.Helper()
	c, err := APIConfig(v)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
