package apiclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystonereg"
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
	return func(ctx context.Context) (string, string, error) {
		ao, eo, tlsCfg, err := clouds.Parse(append([]clouds.ParseOption{clouds.WithCloudName(cloud)}, opts...)...)
		if err != nil {
			return "", "", fmt.Errorf("clouds.yaml: %w", err)
		}
		ao.AllowReauth = false
		pc, err := openstack.NewClient(ao.IdentityEndpoint)
		if err != nil {
			return "", "", fmt.Errorf("cloud %s: auth_url %q: %w", cloud, ao.IdentityEndpoint, err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if tlsCfg != nil {
			tr.TLSClientConfig = tlsCfg.Clone()
		} else {
			tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		pc.HTTPClient = http.Client{Transport: tr, Timeout: 30 * time.Second}
		if err := openstack.Authenticate(ctx, pc, ao); err != nil {
			return "", "", fmt.Errorf("cloud %s: Keystone login at %s: %w", cloud, ao.IdentityEndpoint, err)
		}
		tok := pc.Token()
		if tok == "" {
			return "", "", fmt.Errorf("cloud %s: Keystone answered no token", cloud)
		}
		eo.Type = ServiceType
		endpoint, _ := pc.EndpointLocator(eo) // none: the caller needs a URL of its own
		return tok, endpoint, nil
	}
}
