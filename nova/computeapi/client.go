package computeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"

	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
)

// DefaultMicroversion is the compute microversion the client speaks. 2.61
// or later is required: flavors carry their extra specs (2.61) and a
// server shows its flavor's name and specs (2.47).
const DefaultMicroversion = "2.79"

// MinMicroversion is the oldest microversion the client accepts.
const MinMicroversion = "2.61"

// Config says how to reach Nova.
type Config struct {
	// Cloud names an entry of clouds.yaml (Keystone auth), used when no
	// static token is given.
	Cloud string
	// Endpoint overrides the catalog's compute URL
	// ("http://127.0.0.1:8774/v2.1").
	Endpoint string
	// Token is a static token sent as X-Auth-Token (noauth2:
	// "admin:admin"); with Endpoint it replaces Keystone.
	Token string
	// Microversion of every request; default DefaultMicroversion.
	Microversion string
	// Timeout of one HTTP request; default 30s.
	Timeout time.Duration
	// HTTPClient replaces the default client (tests).
	HTTPClient *http.Client
	// WrapTransport, when set, wraps the default client's transport (the
	// bridge's requestid.Transport: X-OpenStack-Request-ID from ctx when a
	// call names none).
	WrapTransport func(http.RoundTripper) http.RoundTripper
}

// Client calls Nova. It is safe for concurrent use.
type Client struct {
	sc *gophercloud.ServiceClient
}

// CheckMicroversion reports whether v is a 2.N microversion the client
// can use.
func CheckMicroversion(v string) error {
	minor, ok := strings.CutPrefix(v, "2.")
	n, err := strconv.Atoi(minor)
	if !ok || err != nil || n < 0 {
		return fmt.Errorf("microversion %q is not 2.N", v)
	}
	if n < 61 {
		return fmt.Errorf("microversion %s is older than %s (flavors with extra specs)", v, MinMicroversion)
	}
	return nil
}

// New builds a client: Endpoint + Token when both are given, otherwise
// Keystone through clouds.yaml.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Microversion == "" {
		cfg.Microversion = DefaultConfig().Microversion
	}
	if err := CheckMicroversion(cfg.Microversion); err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultConfig().Timeout
	}
	hc := cfg.HTTPClient
	if hc == nil {
		var tr http.RoundTripper = http.DefaultTransport.(*http.Transport).Clone()
		if cfg.WrapTransport != nil {
			tr = cfg.WrapTransport(tr)
		}
		hc = &http.Client{Timeout: cfg.Timeout, Transport: tr}
	}
	sc, err := osclient.New(ctx, osclient.Config{Endpoint: cfg.Endpoint, Token: cfg.Token, Cloud: cfg.Cloud, Type: "compute",
		FromCatalog: openstack.NewComputeV2, HTTPClient: hc, Microversion: cfg.Microversion})
	var ae *osclient.AuthError
	switch {
	case errors.As(err, &ae):
		return nil, classify("authenticate", ae.Err)
	case errors.Is(err, osclient.ErrUnconfigured):
		return nil, errors.New("nova: set [openstack] cloud, or [nova] endpoint_override with token_file")
	case err != nil:
		return nil, err
	}
	return &Client{sc: sc}, nil
}

// Flavor is a flavor as Nova lists it, or (ID empty) as a server shows
// its own (microversion 2.47+: the name, sizes and specs, no id).
type Flavor struct {
	ID         string            `json:"id,omitempty"`
	Name       string            `json:"name"`
	VCPUs      int               `json:"vcpus"`
	RAM        int               `json:"ram"`
	Disk       int               `json:"disk"`
	Ephemeral  int               `json:"ephemeral"`
	Swap       int               `json:"swap"`
	Public     bool              `json:"public"`
	Disabled   bool              `json:"disabled,omitempty"`
	ExtraSpecs map[string]string `json:"extra_specs,omitempty"`
}

// Server is what the Nova path reads of a server.
type Server struct {
	ID        string
	Name      string
	Status    string // ACTIVE, RESIZE, VERIFY_RESIZE, REVERT_RESIZE, ERROR, …
	VMState   string // active, resized, error, …
	TaskState string // "" when idle; resize_prep, resize_migrating, resize_migrated, resize_finish, resize_reverting, resize_confirming
	Host      string // compute service host (admin only)
	Node      string // hypervisor hostname (admin only)
	Flavor    Flavor // the current flavor (Name, sizes and ExtraSpecs; no ID)
	// Fault is the last fault's message when Nova keeps one.
	Fault string
}

// Resizing reports whether a resize is in flight or waits for a confirm.
func (s Server) Resizing() bool {
	return s.Status == "RESIZE" || s.Status == "VERIFY_RESIZE" || strings.HasPrefix(s.TaskState, "resize_")
}

type serverJSON struct {
	Server serverBody `json:"server"`
}

// HeaderRequestID is the header carrying the caller's request id.
const HeaderRequestID = "X-OpenStack-Request-ID"

func (c *Client) opts(requestID string, ok ...int) *gophercloud.RequestOpts {
	o := &gophercloud.RequestOpts{OkCodes: ok}
	if requestID != "" {
		o.MoreHeaders = map[string]string{HeaderRequestID: requestID}
	}
	return o
}

// Server reads a server.
func (c *Client) Server(ctx context.Context, id, requestID string) (Server, error) {
	var out serverJSON
	o := c.opts(requestID, http.StatusOK)
	o.JSONResponse = &out
	_, err := c.sc.Request(ctx, http.MethodGet, c.sc.ServiceURL("servers", id), o)
	if err != nil {
		return Server{}, classify("GET /servers/"+id, err)
	}
	srv := out.Server.server()
	if srv.ID == "" {
		return Server{}, &Error{Op: "GET /servers/" + id, Kind: KindFinal, Err: errors.New("the answer holds no server")}
	}
	return srv, nil
}

type flavorsJSON struct {
	Flavors []struct {
		ID         string            `json:"id"`
		Name       string            `json:"name"`
		VCPUs      int               `json:"vcpus"`
		RAM        int               `json:"ram"`
		Disk       int               `json:"disk"`
		Ephemeral  int               `json:"OS-FLV-EXT-DATA:ephemeral"`
		Swap       any               `json:"swap"` // "" or an int before 2.75
		Public     bool              `json:"os-flavor-access:is_public"`
		Disabled   bool              `json:"OS-FLV-DISABLED:disabled"`
		ExtraSpecs map[string]string `json:"extra_specs"`
	} `json:"flavors"`
}

// flavorPage is Nova's page size for flavor lists.
const flavorPage = 1000

// Flavors lists every flavor, public and private (is_public=None, which
// needs an admin token), with its extra specs.
func (c *Client) Flavors(ctx context.Context, requestID string) ([]Flavor, error) {
	var all []Flavor
	marker := ""
	for range 1000 {
		q := url.Values{"is_public": {"None"}, "limit": {strconv.Itoa(flavorPage)}}
		if marker != "" {
			q.Set("marker", marker)
		}
		var out flavorsJSON
		o := c.opts(requestID, http.StatusOK)
		o.JSONResponse = &out
		if _, err := c.sc.Request(ctx, http.MethodGet, c.sc.ServiceURL("flavors", "detail")+"?"+q.Encode(), o); err != nil {
			return nil, classify("GET /flavors/detail", err)
		}
		for _, f := range out.Flavors {
			fl := Flavor{ID: f.ID, Name: f.Name, VCPUs: f.VCPUs, RAM: f.RAM, Disk: f.Disk, Ephemeral: f.Ephemeral, Public: f.Public,
				Disabled: f.Disabled, ExtraSpecs: f.ExtraSpecs}
			switch n := f.Swap.(type) {
			case float64:
				fl.Swap = int(n)
			case json.Number:
				if i, err := n.Int64(); err == nil {
					fl.Swap = int(i)
				}
			}
			all = append(all, fl)
		}
		if len(out.Flavors) < flavorPage {
			return all, nil
		}
		marker = out.Flavors[len(out.Flavors)-1].ID
	}
	return nil, &Error{Op: "GET /flavors/detail", Kind: KindFinal, Err: errors.New("more than a million flavors")}
}

func (c *Client) action(ctx context.Context, id, name string, body any, requestID string) error {
	o := c.opts(requestID, http.StatusAccepted, http.StatusNoContent)
	o.JSONBody = map[string]any{name: body}
	_, err := c.sc.Request(ctx, http.MethodPost, c.sc.ServiceURL("servers", id, "action"), o)
	if err != nil {
		return classify("POST /servers/"+id+"/action "+name, err)
	}
	return nil
}

// Resize asks Nova to resize the server to flavorID. Nova answers at once
// (202); the resize runs in the background and ends in VERIFY_RESIZE.
func (c *Client) Resize(ctx context.Context, id, flavorID, requestID string) error {
	return c.action(ctx, id, "resize", map[string]string{"flavorRef": flavorID}, requestID)
}

// ConfirmResize confirms a resize waiting in VERIFY_RESIZE.
func (c *Client) ConfirmResize(ctx context.Context, id, requestID string) error {
	return c.action(ctx, id, "confirmResize", nil, requestID)
}

// RevertResize reverts a resize waiting in VERIFY_RESIZE.
func (c *Client) RevertResize(ctx context.Context, id, requestID string) error {
	return c.action(ctx, id, "revertResize", nil, requestID)
}
