package apiclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystonereg"
	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
)

// ServiceType is the bridge's service type in Keystone's catalog
// (vgpu-bridge keystone register puts it there).
const ServiceType = keystonereg.ServiceType

// CloudTokenSource logs in to Keystone with the credentials of cloud in
// clouds.yaml and yields the token, to send as X-Auth-Token. clouds.yaml
// (and secure.yaml) are found as python-openstackclient finds them:
// $OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/,
// /etc/openstack/; opts may name other places. The cloud's cacert and
// verify settings apply to the Keystone call.
func CloudTokenSource(cloud string, opts ...clouds.ParseOption) TokenSource {
	login := CloudLogin(cloud, opts...)
	return func(ctx context.Context) (string, error) {
		tok, _, err := login(ctx)
		return tok, err
	}
}

// CloudLogin is CloudTokenSource that also reads the bridge's endpoint
// from the catalog Keystone answers with: the service of type
// ServiceType, in the cloud's region_name and interface (default public).
// The endpoint is "" when the catalog has none.
func CloudLogin(cloud string, opts ...clouds.ParseOption) Login {
	return KeystoneLogin("cloud "+cloud, func() (osclient.Cloud, error) {
		c, err := osclient.ParseCloud(cloud, opts...)
		if err != nil {
			return c, fmt.Errorf("clouds.yaml: %w", err)
		}
		return c, nil
	})
}

// EnvLogin is CloudLogin with the OS_* variables of an openrc file
// (osclient.EnvCloud) instead of a cloud of clouds.yaml; getenv reads
// them (os.Getenv).
func EnvLogin(getenv func(string) string, opts ...clouds.ParseOption) Login {
	return KeystoneLogin("OS_* variables", func() (osclient.Cloud, error) {
		c, err := osclient.ParseEnv(getenv, opts...)
		if err != nil {
			return c, fmt.Errorf("OS_* variables: %w", err)
		}
		return c, nil
	})
}

// KeystoneLogin logs in with the credentials parse reads, names them what
// in errors, and finds the bridge's endpoint in the catalog (CloudLogin).
func KeystoneLogin(what string, parse func() (osclient.Cloud, error)) Login {
	return func(ctx context.Context) (string, string, error) {
		c, err := parse()
		if err != nil {
			return "", "", err
		}
		c.Auth.AllowReauth = false
		if c.TLS == nil {
			c.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		} else {
			c.TLS = c.TLS.Clone()
		}
		pc, err := c.Login(ctx, http.Client{Timeout: 30 * time.Second})
		if errors.Is(err, osclient.ErrAuthURL) {
			return "", "", fmt.Errorf("%s: %w", what, err)
		}
		if err != nil {
			return "", "", fmt.Errorf("%s: Keystone login at %s: %w", what, c.Auth.IdentityEndpoint, err)
		}
		tok := pc.Token()
		if tok == "" {
			return "", "", fmt.Errorf("%s: Keystone answered no token", what)
		}
		c.Endpoint.Type = ServiceType
		endpoint, _ := pc.EndpointLocator(c.Endpoint) // none: the caller needs a URL of its own
		return tok, endpoint, nil
	}
}
