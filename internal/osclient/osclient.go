// Package osclient is the one place OpenStack clients are configured: it
// reads a cloud of clouds.yaml, logs in to its Keystone, and builds the
// gophercloud service client of one service (Placement, Nova, Keystone):
// a fixed endpoint with a static token (noauth deployments and tests), or
// a cloud whose catalog gives the endpoint unless one is set.
package osclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
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

// Cloud is one entry of clouds.yaml, read.
type Cloud struct {
	Name string
	// Auth are the Keystone credentials (AllowReauth set: a client logs
	// in again when its token expires).
	Auth gophercloud.AuthOptions
	// Endpoint selects endpoints in the catalog (region, interface).
	Endpoint gophercloud.EndpointOpts
	// TLS is the cloud's cacert/verify/cert settings; nil when it has none.
	TLS *tls.Config
}

// ParseCloud reads the entry name of clouds.yaml (and secure.yaml), found
// as python-openstackclient finds it ($OS_CLIENT_CONFIG_FILE,
// ./clouds.yaml, ~/.config/openstack/, /etc/openstack/) unless opts say
// otherwise. It makes no network call.
func ParseCloud(name string, opts ...clouds.ParseOption) (Cloud, error) {
	ao, eo, tlsc, err := clouds.Parse(append([]clouds.ParseOption{clouds.WithCloudName(name)}, opts...)...)
	if err != nil {
		return Cloud{}, err
	}
	ao.AllowReauth = true
	return Cloud{Name: name, Auth: ao, Endpoint: eo, TLS: tlsc}, nil
}

// ErrAuthURL wraps a cloud's auth_url that is no URL.
var ErrAuthURL = errors.New("auth_url")

// Login authenticates against the cloud's Keystone. hc carries every
// request; when the cloud has TLS settings they replace its transport.
// An auth_url that is no URL fails with ErrAuthURL; other errors are
// gophercloud's.
func (c Cloud) Login(ctx context.Context, hc http.Client) (*gophercloud.ProviderClient, error) {
	pc, err := openstack.NewClient(c.Auth.IdentityEndpoint)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrAuthURL, c.Auth.IdentityEndpoint, err)
	}
	if c.TLS != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = c.TLS
		hc.Transport = tr
	}
	pc.HTTPClient = hc
	if err := openstack.Authenticate(ctx, pc, c.Auth); err != nil {
		return nil, err
	}
	return pc, nil
}

// Config says how to reach one service.
type Config struct {
	// Endpoint and Token, when both are set, make a client without
	// Keystone. Endpoint alone overrides the catalog's URL.
	Endpoint, Token string
	// Cloud names an entry of clouds.yaml; ParseOptions say where else to
	// look for it, or add settings (clouds.WithCACertPath).
	Cloud        string
	ParseOptions []clouds.ParseOption
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
	switch {
	case cfg.Endpoint != "" && cfg.Token != "":
		return cfg.Static(), nil
	case cfg.Cloud != "":
		c, err := ParseCloud(cfg.Cloud, cfg.ParseOptions...)
		if err != nil {
			return nil, fmt.Errorf("clouds.yaml cloud %q: %w", cfg.Cloud, err)
		}
		pc, err := c.Login(ctx, *cfg.HTTPClient)
		if err != nil {
			return nil, &AuthError{Err: err}
		}
		return cfg.Service(pc, c.Endpoint)
	default:
		return nil, ErrUnconfigured
	}
}

// Static is the client of Endpoint with Token, without Keystone.
func (cfg Config) Static() *gophercloud.ServiceClient {
	pc := &gophercloud.ProviderClient{HTTPClient: *cfg.HTTPClient}
	pc.SetToken(cfg.Token)
	return cfg.at(pc)
}

// Service is the client of the service on a provider logged in to
// Keystone: at Endpoint when set (an override needs no catalog entry: a
// cloud whose catalog lacks the service, or names an unreachable URL,
// still works), else at the catalog's URL.
func (cfg Config) Service(pc *gophercloud.ProviderClient, eo gophercloud.EndpointOpts) (*gophercloud.ServiceClient, error) {
	if cfg.Endpoint != "" {
		return cfg.at(pc), nil
	}
	sc, err := cfg.FromCatalog(pc, eo)
	if err != nil {
		return nil, fmt.Errorf("%s endpoint: %w", cfg.Type, err)
	}
	sc.Microversion = cfg.Microversion
	return sc, nil
}

func (cfg Config) at(pc *gophercloud.ProviderClient) *gophercloud.ServiceClient {
	return &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: gophercloud.NormalizeURL(cfg.Endpoint), Type: cfg.Type,
		Microversion: cfg.Microversion}
}
