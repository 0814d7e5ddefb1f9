package osclient

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack"
)

func TestNew(t *testing.T) {
	// A cloud whose Keystone refuses connections: authentication fails.
	dir := t.TempDir()
	yaml := "clouds:\n  down:\n    auth:\n      auth_url: http://127.0.0.1:1/v3\n      username: u\n      password: p\n" +
		"      project_name: p\n      user_domain_name: Default\n      project_domain_name: Default\n"
	if err := os.WriteFile(filepath.Join(dir, "clouds.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", filepath.Join(dir, "clouds.yaml"))
	base := Config{Type: "placement", FromCatalog: openstack.NewPlacementV1, HTTPClient: &http.Client{}, Microversion: "1.39"}

	fixed := base
	fixed.Endpoint, fixed.Token = "http://127.0.0.1:8778", "admin"
	sc, err := New(context.Background(), fixed)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Endpoint != "http://127.0.0.1:8778/" || sc.Type != "placement" || sc.Microversion != "1.39" || sc.Token() != "admin" {
		t.Errorf("fixed-endpoint client: endpoint %q type %q microversion %q token %q", sc.Endpoint, sc.Type, sc.Microversion, sc.Token())
	}

	for _, tc := range []struct {
		name  string
		cfg   Config
		check func(error) bool
	}{
		{"nothing set", base, func(err error) bool { return errors.Is(err, ErrUnconfigured) }},
		{"endpoint without token", Config{Endpoint: "http://x"}, func(err error) bool { return errors.Is(err, ErrUnconfigured) }},
		{"unknown cloud", Config{Cloud: "nosuch", HTTPClient: &http.Client{}}, func(err error) bool {
			return err != nil && strings.Contains(err.Error(), `clouds.yaml cloud "nosuch"`)
		}},
		{"Keystone down", Config{Cloud: "down", HTTPClient: &http.Client{}, FromCatalog: openstack.NewPlacementV1}, func(err error) bool {
			var ae *AuthError
			return errors.As(err, &ae)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := New(context.Background(), tc.cfg)
			if sc != nil || !tc.check(err) {
				t.Errorf("New = %v, %v", sc, err)
			}
		})
	}
}
