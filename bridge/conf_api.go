package bridge

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optAPIListen = apiOptions.String("api", "listen", "127.0.0.1:9797",
		"Address (host:port) of the operator API, /metrics and the health checks. Example: 0.0.0.0:9797")
	optAPIAuth = apiOptions.Choice("api", "auth_strategy", "token", []string{"noauth", "token", "keystone"},
		"How operator API callers are authenticated: token checks X-Auth-Token (or Authorization: Bearer) "+
			"against token_file; keystone validates it with Keystone (see [keystone]); noauth lets everyone in "+
			"as admin and is for labs only. Example: token")
	optAPITokenFile = apiOptions.String("api", "token_file", "",
		"With auth_strategy = token: a file of lines \"TOKEN ROLE [NAME [PROJECT]]\", ROLE being reader, member (a "+
			"reader of PROJECT that may also POST /v1/requests for its instances) or admin; "+
			"a reader with a PROJECT sees only that project's instances, requests, allocations and events and no fleet "+
			"route (x-vgpu-access in /v1/openapi.json); one without is a fleet reader. Re-read on SIGHUP (a file that does not load keeps the tokens in use). Example: /etc/vgpu-bridge/secrets/api-tokens")
	optAPIProjectRate = apiOptions.Float("api", "project_rate", 50, 0, 1e6,
		"Requests per second each project may make, over POST /v1/requests and every webhook source together: a "+
			"request takes a token of the project of each instance it names (an instance the bridge does not know yet "+
			"counts for none). Past it they are refused with 429 (code rate_limited_project, Retry-After), so one "+
			"project's flood cannot fill the inbox before the others; Alertmanager messages are not refused (Alertmanager "+
			"does not retry a 429) but spend the tokens. Per replica. 0 turns the limit off. Example: 20")
	optAPIProjectBurst = apiOptions.Int("api", "project_burst", 200, 1, 1000000,
		"Requests a project may make at once above project_rate. Example: 500")
	optAPITLSCert = apiOptions.String("api", "tls_cert_file", "",
		"PEM certificate (chain) to serve the API over TLS (1.2 with ECDHE AEAD suites, or 1.3); empty serves plain HTTP. "+
			"Re-read with tls_key_file on SIGHUP (renewal without a restart). Example: /etc/vgpu-bridge/tls/api.crt")
	optAPITLSKey = apiOptions.String("api", "tls_key_file", "",
		"PEM private key of tls_cert_file. Example: /etc/vgpu-bridge/tls/api.key")
	optAPIClientCA = apiOptions.String("api", "tls_client_ca_file", "",
		"With TLS: a PEM CA bundle; every client of the API listener must then present a certificate it signs "+
			"(mutual TLS, on top of auth_strategy). When webhooks share this listener, their senders need one too. "+
			"Example: /etc/vgpu-bridge/tls/operators-ca.crt")
)

// serverTLS is the TLS configuration of the bridge's listeners: TLS 1.2
// or 1.3 only, and with 1.2 only forward-secret AEAD suites (ECDHE with
// AES-GCM or ChaCha20-Poly1305); the certificate is read now.
func serverTLS(certFile, keyFile string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
	}, nil
}

// apiOptions are the options declared in this file (the server's limits
// are package api's); Options assembles them into the daemon's set with
// validateAPI.
var apiOptions = conf.NewGroup().
	SectionHelp("api", "The operator API (described at GET /v1/openapi.json), /metrics, /healthz and /readyz.")

// validateAPI tests relations between the options of this file.
func validateAPI(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if l := optAPIListen.Get(v); l != "" {
		if _, _, err := net.SplitHostPort(l); err != nil {
			errs = append(errs, &conf.Error{Section: "api", Option: "listen", Value: l, Problem: "not host:port; allowed: e.g. 127.0.0.1:9797"})
		}
	}
	if optAPIAuth.Get(v) == "token" && optAPITokenFile.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "api", Option: "token_file", Problem: "is required when auth_strategy = token; allowed: a file of \"TOKEN ROLE\" lines"})
	}
	if (optAPITLSCert.Get(v) == "") != (optAPITLSKey.Get(v) == "") {
		errs = append(errs, &conf.Error{Section: "api", Option: "tls_key_file", Value: optAPITLSKey.Get(v), Problem: "tls_cert_file and tls_key_file go together"})
	}
	if optAPIClientCA.Get(v) != "" && optAPITLSCert.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "api", Option: "tls_client_ca_file", Value: optAPIClientCA.Get(v), Problem: "needs tls_cert_file (client certificates are a TLS feature)"})
	}
	return errs
}

// APIConfig maps [api] to api.Config (without logger, registry, version):
// package api's limits, and the listener, authentication and TLS.
func APIConfig(v *conf.Values) (api.Config, error) {
	c := api.ConfigFrom(v)
	c.Listen = optAPIListen.Get(v)
	pol, err := AccessPolicy(v)
	if err != nil {
		return c, fmt.Errorf("[oslo_policy] policy_file: %w", err)
	}
	c.Policy = pol
	switch optAPIAuth.Get(v) {
	case "noauth":
		c.Auth = api.NoAuth{}
	case "token":
		st, err := api.LoadTokenFile(optAPITokenFile.Get(v))
		if err != nil {
			return c, err
		}
		c.Auth = st
	case "keystone": // bridge/keystoneauth, options in conf_keystone.go
		kc, err := KeystoneAuthConfig(v, nil)
		if err != nil {
			return c, err
		}
		kc.Policy = pol // its base rules say what a token's caller is
		ka, err := keystoneauth.New(kc)
		if err != nil {
			return c, err
		}
		c.Auth = ka
	}
	if cert := optAPITLSCert.Get(v); cert != "" {
		tc, err := serverTLS(cert, optAPITLSKey.Get(v))
		if err != nil {
			return c, fmt.Errorf("[api] tls_cert_file: %w", err)
		}
		if f := optAPIClientCA.Get(v); f != "" {
			pem, err := os.ReadFile(f)
			if err != nil {
				return c, fmt.Errorf("[api] tls_client_ca_file: %w", err)
			}
			tc.ClientCAs = x509.NewCertPool()
			if !tc.ClientCAs.AppendCertsFromPEM(pem) {
				return c, fmt.Errorf("[api] tls_client_ca_file %s holds no PEM certificate", f)
			}
			tc.ClientAuth = tls.RequireAndVerifyClientCert
		}
		c.TLSConfig = tc
	}
	return c, nil
}

// APIListener is where the API listens ([api] listen) and the certificate
// it serves there ([api] tls_cert_file, "" for plain HTTP): what
// `vgpu-bridge healthcheck` asks.
func APIListener(v *conf.Values) (listen, certFile string) {
	return optAPIListen.Get(v), optAPITLSCert.Get(v)
}
