// Package osclient is the one place OpenStack clients are configured: it
// reads a cloud of clouds.yaml, logs in to its Keystone, and builds the
// gophercloud service client of one service (Placement, Nova, Keystone):
// a fixed endpoint with a static token (noauth deployments and tests), or
// a cloud whose catalog gives the endpoint unless one is set.
package osclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

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

// EnvCloudName is the name the OS_* variables' cloud goes by, as in
// openstacksdk.
const EnvCloudName = "envvars"

// HasEnv reports whether getenv has the OS_* variables of an openrc file
// (OS_AUTH_URL at least).
func HasEnv(getenv func(string) string) bool { return getenv("OS_AUTH_URL") != "" }

// EnvCloud is the clouds.yaml entry the OS_* variables of an openrc file
// make, as openstacksdk reads them: OS_AUTH_URL, OS_AUTH_TYPE (password,
// token or v3applicationcredential, with or without "v3"), OS_USERNAME or
// OS_USER_ID, OS_PASSWORD, OS_TOKEN, OS_APPLICATION_CREDENTIAL_ID or _NAME
// and _SECRET, OS_PROJECT_NAME or OS_PROJECT_ID (OS_TENANT_* too),
// OS_USER_DOMAIN_*, OS_PROJECT_DOMAIN_*, OS_DOMAIN_* (a domain scope, or
// both domains' default), OS_SYSTEM_SCOPE, OS_REGION_NAME, OS_INTERFACE
// (OS_ENDPOINT_TYPE), OS_CACERT, OS_CERT, OS_KEY and OS_INSECURE.
func EnvCloud(getenv func(string) string) (clouds.Cloud, error) {
	first := func(names ...string) string {
		for _, n := range names {
			if v := getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	a := &clouds.AuthInfo{
		AuthURL:           getenv("OS_AUTH_URL"),
		ProjectName:       first("OS_PROJECT_NAME", "OS_TENANT_NAME"),
		ProjectID:         first("OS_PROJECT_ID", "OS_TENANT_ID"),
		UserDomainName:    getenv("OS_USER_DOMAIN_NAME"),
		UserDomainID:      getenv("OS_USER_DOMAIN_ID"),
		ProjectDomainName: getenv("OS_PROJECT_DOMAIN_NAME"),
		ProjectDomainID:   getenv("OS_PROJECT_DOMAIN_ID"),
		DomainName:        getenv("OS_DOMAIN_NAME"),
		DomainID:          getenv("OS_DOMAIN_ID"),
		SystemScope:       getenv("OS_SYSTEM_SCOPE"),
	}
	if a.AuthURL == "" {
		return clouds.Cloud{}, errors.New("OS_AUTH_URL is not set")
	}
	authType := strings.TrimPrefix(strings.ToLower(getenv("OS_AUTH_TYPE")), "v3")
	if authType == "" {
		// openstacksdk's default is password; a token alone means token.
		authType = "password"
		if getenv("OS_TOKEN") != "" && getenv("OS_PASSWORD") == "" {
			authType = "token"
		}
	}
	switch authType {
	case "password":
		a.Username, a.UserID, a.Password = getenv("OS_USERNAME"), first("OS_USER_ID", "OS_USERID"), getenv("OS_PASSWORD")
		if a.Username == "" && a.UserID == "" {
			return clouds.Cloud{}, errors.New("OS_AUTH_URL is set but neither OS_USERNAME nor OS_USER_ID")
		}
		if a.Password == "" {
			return clouds.Cloud{}, errors.New("OS_USERNAME is set but not OS_PASSWORD")
		}
	case "token":
		if a.Token = getenv("OS_TOKEN"); a.Token == "" {
			return clouds.Cloud{}, errors.New("OS_AUTH_TYPE is token but OS_TOKEN is not set")
		}
	case "applicationcredential":
		a.ApplicationCredentialID = getenv("OS_APPLICATION_CREDENTIAL_ID")
		a.ApplicationCredentialName = getenv("OS_APPLICATION_CREDENTIAL_NAME")
		a.ApplicationCredentialSecret = getenv("OS_APPLICATION_CREDENTIAL_SECRET")
		if a.ApplicationCredentialSecret == "" || (a.ApplicationCredentialID == "" && a.ApplicationCredentialName == "") {
			return clouds.Cloud{}, errors.New("application credential: set OS_APPLICATION_CREDENTIAL_ID (or _NAME with OS_USERNAME) and OS_APPLICATION_CREDENTIAL_SECRET")
		}
		if a.ApplicationCredentialID == "" {
			a.Username, a.UserID = getenv("OS_USERNAME"), first("OS_USER_ID", "OS_USERID")
		}
		// An application credential carries its own scope; Keystone
		// refuses another.
		a.ProjectName, a.ProjectID, a.ProjectDomainName, a.ProjectDomainID, a.SystemScope = "", "", "", "", ""
	default:
		return clouds.Cloud{}, fmt.Errorf("OS_AUTH_TYPE %q: use password, token or v3applicationcredential", getenv("OS_AUTH_TYPE"))
	}
	if a.Username == "" {
		// Keystone names the user's domain only beside a user name: a
		// token, an application credential's id or a user id carries it.
		if a.ProjectDomainName == "" && a.ProjectDomainID == "" && a.ProjectName != "" {
			a.ProjectDomainName, a.ProjectDomainID = a.DomainName, a.DomainID
		}
		a.UserDomainName, a.UserDomainID, a.DomainName, a.DomainID = "", "", "", ""
	}
	c := clouds.Cloud{
		AuthInfo:       a,
		RegionName:     getenv("OS_REGION_NAME"),
		Interface:      first("OS_INTERFACE", "OS_ENDPOINT_TYPE"),
		CACertFile:     getenv("OS_CACERT"),
		ClientCertFile: getenv("OS_CERT"),
		ClientKeyFile:  getenv("OS_KEY"),
	}
	if v := strings.ToLower(getenv("OS_INSECURE")); v == "true" || v == "1" || v == "yes" {
		verify := false
		c.Verify = &verify
	}
	return c, nil
}

// ParseEnv is ParseCloud for the OS_* variables of an openrc file
// (EnvCloud), read through the same clouds.yaml logic so that both sources
// mean the same; opts may add settings (clouds.WithRegion). It makes no
// network call.
func ParseEnv(getenv func(string) string, opts ...clouds.ParseOption) (Cloud, error) {
	c, err := EnvCloud(getenv)
	if err != nil {
		return Cloud{}, err
	}
	// JSON is YAML.
	b, err := json.Marshal(clouds.Clouds{Clouds: map[string]clouds.Cloud{EnvCloudName: c}})
	if err != nil {
		return Cloud{}, fmt.Errorf("OS_* variables: %w", err)
	}
	return ParseCloud(EnvCloudName, append([]clouds.ParseOption{clouds.WithCloudsYAML(bytes.NewReader(b))}, opts...)...)
}
