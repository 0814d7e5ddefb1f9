// Package osclient builds the gophercloud service client of one OpenStack
// service the bridge calls (Placement, Nova): a fixed endpoint with a
// static token (noauth deployments and tests), or a cloud of clouds.yaml,
// whose catalog gives the endpoint unless one is set.
package osclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
)

// ErrUnconfigured is returned when neither an endpoint with a token nor a
// cloud is set.
var ErrUnconfigured = errors.New("neither a cloud nor an endpoint with a token is set")

// AuthError is a failure to authenticate against Keystone; Err is
// gophercloud's error, for the caller to classify.
type AuthError struct{ Err error }

func (e *AuthError) Error() string { return "authenticate: " + e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// Config says how to reach one service.
type Config struct {
	// Endpoint and Token, when both are set, make a client without
	// Keystone. Endpoint alone overrides the catalog's URL.
	Endpoint, Token string
	// Cloud names an entry of clouds.yaml.
	Cloud string
	// Type is the service type of the fixed-endpoint client ("placement").
	Type string
	// FromCatalog makes the client from an authenticated provider
	// (openstack.NewPlacementV1, openstack.NewComputeV2).
	FromCatalog func(*gophercloud.ProviderClient, gophercloud.EndpointOpts) (*gophercloud.ServiceClient, error)
	// HTTPClient carries every request, Keystone's included.
	HTTPClient *http.Client
	// Microversion is sent with every request.
	Microversion string
}

// New builds the service client.
func New(ctx context.Context, cfg Config) (*gophercloud.ServiceClient, error) {
	var sc *gophercloud.ServiceClient
	switch {
	case cfg.Endpoint != "" && cfg.Token != "":
		pc := &gophercloud.ProviderClient{HTTPClient: *cfg.HTTPClient}
		pc.SetToken(cfg.Token)
		sc = &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: gophercloud.NormalizeURL(cfg.Endpoint), Type: cfg.Type}
	case cfg.Cloud != "":
		ao, eo, tlsc, err := clouds.Parse(clouds.WithCloudName(cfg.Cloud))
		if err != nil {
			return nil, fmt.Errorf("clouds.yaml cloud %q: %w", cfg.Cloud, err)
		}
		ao.AllowReauth = true
		pc, err := config.NewProviderClient(ctx, ao, config.WithHTTPClient(*cfg.HTTPClient), config.WithTLSConfig(tlsc))
		if err != nil {
			return nil, &AuthError{Err: err}
		}
		if cfg.Endpoint != "" {
			// An override needs no catalog entry: a cloud whose catalog
			// lacks the service (or names an unreachable URL) still works.
			sc = &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: gophercloud.NormalizeURL(cfg.Endpoint), Type: cfg.Type}
			break
		}
		if sc, err = cfg.FromCatalog(pc, eo); err != nil {
			return nil, fmt.Errorf("%s endpoint: %w", cfg.Type, err)
		}
	default:
		return nil, ErrUnconfigured
	}
	sc.Microversion = cfg.Microversion
	return sc, nil
}
