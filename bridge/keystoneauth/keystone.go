package keystoneauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"

	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
)

// KeystoneConfig says how the bridge reaches Keystone to validate tokens.
type KeystoneConfig struct {
	// Cloud is the clouds.yaml entry with the bridge's own (service)
	// credentials; Keystone's policy must let them validate others' tokens
	// (the service or admin role).
	Cloud string
	// ParseOptions add to clouds.Parse's (tests: another clouds.yaml).
	ParseOptions []clouds.ParseOption
	// Timeout of one HTTP request; default DefaultConfig's Timeout.
	Timeout time.Duration
	// LoginRetry is how long a failed login of the bridge itself is
	// remembered before the next try; default 5s.
	LoginRetry time.Duration
}

// Keystone validates tokens with Keystone's identity v3 API
// (GET /v3/auth/tokens?nocatalog with X-Subject-Token), logged in with
// the bridge's credentials from clouds.yaml. It logs in at the first
// validation, and again when its own token expires.
type Keystone struct {
	cfg   KeystoneConfig
	cloud osclient.Cloud

	mu       sync.Mutex
	sc       *gophercloud.ServiceClient
	lastErr  error
	lastFail time.Time
}

var _ Validator = (*Keystone)(nil)

// NewKeystone reads the cloud's entry of clouds.yaml (no network call).
func NewKeystone(cfg KeystoneConfig) (*Keystone, error) {
	if cfg.Cloud == "" {
		return nil, errors.New("keystone: no clouds.yaml cloud named")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultConfig().Timeout // [keystone] timeout's default
	}
	if cfg.LoginRetry <= 0 {
		cfg.LoginRetry = 5 * time.Second
	}
	cloud, err := osclient.ParseCloud(cfg.Cloud, cfg.ParseOptions...)
	if err != nil {
		return nil, fmt.Errorf("keystone: clouds.yaml cloud %q: %w", cfg.Cloud, err)
	}
	return &Keystone{cfg: cfg, cloud: cloud}, nil
}

// AuthURL is the identity endpoint of the clouds.yaml cloud k logs in to.
func (k *Keystone) AuthURL() string { return k.cloud.Auth.IdentityEndpoint }

// IdentityClient is k's identity v3 client, logged in with the bridge's
// credentials (the unified limits' reads, package unifiedlimits).
func (k *Keystone) IdentityClient(ctx context.Context) (*gophercloud.ServiceClient, error) {
	return k.client(ctx)
}

func (k *Keystone) client(ctx context.Context) (*gophercloud.ServiceClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.sc != nil {
		return k.sc, nil
	}
	if k.lastErr != nil && time.Since(k.lastFail) < k.cfg.LoginRetry {
		return nil, k.lastErr
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	hc := http.Client{Timeout: k.cfg.Timeout, Transport: tr}
	pc, err := k.cloud.Login(ctx, hc)
	if err == nil {
		var sc *gophercloud.ServiceClient
		if sc, err = openstack.NewIdentityV3(pc, k.cloud.Endpoint); err == nil {
			k.sc, k.lastErr = sc, nil
			return sc, nil
		}
	}
	k.lastErr = fmt.Errorf("keystone: log in as cloud %q at %s: %w", k.cloud.Name, k.cloud.Auth.IdentityEndpoint, err)
	k.lastFail = time.Now()
	return nil, k.lastErr
}

// tokenBody is the part of Keystone's token document the bridge reads.
type tokenBody struct {
	ExpiresAt time.Time `json:"expires_at"`
	User      struct {
		ID     string `json:"id"`
		Name   string `json:"name"`
		Domain struct {
			Name string `json:"name"`
		} `json:"domain"`
	} `json:"user"`
	Project *struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"project"`
	Domain *struct {
		ID string `json:"id"`
	} `json:"domain"`
	System map[string]any `json:"system"`
	Roles  []struct {
		Name string `json:"name"`
	} `json:"roles"`
}

// Validate implements Validator.
func (k *Keystone) Validate(ctx context.Context, token string) (*TokenInfo, error) {
	sc, err := k.client(ctx)
	if err != nil {
		return nil, err
	}
	var r tokens.GetResult
	resp, err := sc.Get(ctx, sc.ServiceURL("auth", "tokens")+"?nocatalog", &r.Body, &gophercloud.RequestOpts{
		MoreHeaders: map[string]string{"X-Subject-Token": token},
		OkCodes:     []int{http.StatusOK, http.StatusNonAuthoritativeInfo},
	})
	_, r.Header, r.Err = gophercloud.ParseResponse(resp, err)
	if gophercloud.ResponseCodeIs(r.Err, http.StatusNotFound) {
		return nil, ErrInvalidToken
	}
	if r.Err != nil {
		// Keystone's error bodies may quote the subject token.
		return nil, fmt.Errorf("keystone: validate token: %s", strings.ReplaceAll(r.Err.Error(), token, "<token>"))
	}
	var b tokenBody
	if err := r.ExtractInto(&b); err != nil {
		return nil, fmt.Errorf("keystone: token document: %w", err)
	}
	return b.info(), nil
}

func (b *tokenBody) info() *TokenInfo {
	ti := &TokenInfo{UserID: b.User.ID, UserName: b.User.Name, UserDomain: b.User.Domain.Name,
		System: b.System != nil, ExpiresAt: b.ExpiresAt}
	if b.Project != nil {
		ti.ProjectID, ti.ProjectName = b.Project.ID, b.Project.Name
	}
	if b.Domain != nil {
		ti.DomainID = b.Domain.ID
	}
	for _, r := range b.Roles {
		ti.Roles = append(ti.Roles, r.Name)
	}
	return ti
}
