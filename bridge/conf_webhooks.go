package bridge

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

const webhookSourcePrefix = "webhook_source"

var (
	optWHListen = webhooksOptions.String("webhooks", "listen", "",
		"Address (host:port) of the webhook listener. Empty, or the same as [api] listen, serves webhooks on the "+
			"operator API's listener (with [api]'s TLS; client_ca_file is then added to it). Another address starts "+
			"a second listener with this section's TLS and timeouts. Example: 0.0.0.0:9443")
	optWHTLSCert = webhooksOptions.String("webhooks", "tls_cert_file", "",
		"PEM certificate (chain) of a separate webhook listener; empty serves plain HTTP (only behind a TLS proxy). Re-read on SIGHUP. "+
			"Example: /etc/vgpu-bridge/tls/webhooks.crt")
	optWHTLSKey = webhooksOptions.String("webhooks", "tls_key_file", "",
		"PEM private key of tls_cert_file. Example: /etc/vgpu-bridge/tls/webhooks.key")
	optWHClientCA = webhooksOptions.String("webhooks", "client_ca_file", "",
		"PEM CA bundle that signs the client certificates of auth = mtls sources. The listener then asks every "+
			"client for a certificate (sources with other auth need none). Example: /etc/vgpu-bridge/tls/webhook-clients-ca.crt")
	optWHReadHeaderTimeout = webhooksOptions.Duration("webhooks", "read_header_timeout", 5*time.Second, 100*time.Millisecond, time.Minute,
		"How long a client of a separate listener may take to send its headers (cuts off slowloris clients). Example: 5s")
	optWHReadTimeout = webhooksOptions.Duration("webhooks", "read_timeout", 10*time.Second, 100*time.Millisecond, 10*time.Minute,
		"How long a client of a separate listener may take to send a whole request, body included. Example: 10s")
	optWHWriteTimeout = webhooksOptions.Duration("webhooks", "write_timeout", 15*time.Second, time.Second, 10*time.Minute,
		"How long an answer of a separate listener may take, commit included. Example: 15s")
	optWHIdleTimeout = webhooksOptions.Duration("webhooks", "idle_timeout", 60*time.Second, time.Second, 10*time.Minute,
		"How long a separate listener keeps an idle keep-alive connection. Example: 60s")
	optWHMaxHeaderBytes = webhooksOptions.Int("webhooks", "max_header_bytes", 16<<10, 4<<10, 1<<20,
		"Largest request header block a separate listener accepts. Example: 16384")
)

// webhooksOptions are the options declared in this file; Options assembles them
// into the daemon's set with checkWebhooks.
var webhooksOptions = conf.NewGroup().
	SectionHelp("webhooks", "The webhook endpoint POST /v1/webhooks/{source}: its listener, group commit, idempotency and callbacks. Sources are [webhook_source:NAME] sections.").
	Template(webhookSourcePrefix,
		"One webhook source per section, e.g. [webhook_source:batch-scheduler]; senders POST to /v1/webhooks/batch-scheduler.",
		conf.Option{Name: "auth", Kind: conf.KindChoice, Default: "hmac", Choices: []string{"hmac", "bearer", "mtls", "jwt"},
			Help: "How the source authenticates: hmac (X-Hub-Signature-256, a signed body acting once, or Standard Webhooks " +
				"headers), bearer (Authorization: Bearer), mtls (a client certificate signed by [webhooks] client_ca_file), " +
				"jwt (Authorization: Bearer with a JWT signed RS256, ES256 or EdDSA by a key of jwks_url or jwks_file, " +
				"with jwt_issuer and jwt_audience, valid for at most jwt_max_lifetime). Example: hmac"},
		conf.Option{Name: "format", Kind: conf.KindChoice, Default: "native", Choices: []string{"native", "alertmanager"},
			Help: "Payload format: native or alertmanager (Alertmanager's webhook_config; needs auth = bearer, jwt or mtls). Example: alertmanager"},
		conf.Option{Name: "secret_files", Kind: conf.KindList,
			Help: "Files each holding one HMAC secret (not world-readable). List two during a rotation: either verifies, " +
				"and callbacks carry a signature of each. A secret of the form whsec_<base64> is used as its decoded bytes. Re-read on SIGHUP. " +
				"Example: /etc/vgpu-bridge/secrets/batch.new,/etc/vgpu-bridge/secrets/batch.old"},
		conf.Option{Name: "token_files", Kind: conf.KindList,
			Help: "With auth = bearer: files each holding one accepted token (several during a rotation). Re-read on SIGHUP. " +
				"Example: /etc/vgpu-bridge/secrets/alertmanager.token"},
		conf.Option{Name: "allowed_cidrs", Kind: conf.KindList,
			Help: "Client addresses allowed to send; empty allows any. Example: 10.20.0.0/16,2001:db8::/32"},
		conf.Option{Name: "allowed_projects", Kind: conf.KindList,
			Help: "Keystone project ids whose instances the source may act on; empty allows any. A request for an instance of " +
				"another project, or one the bridge does not know (with Nova configured: one Nova does not have, the bridge asks it), is refused 403 (project_not_allowed), " +
				"the same answer for both; " +
				"Alertmanager alerts naming one are skipped. Example: 3f2b0c9e8d7a4b6c9e1f0a2b3c4d5e6f"},
		conf.Option{Name: "trusted_proxies", Kind: conf.KindList,
			Help: "Proxies whose X-Forwarded-For is believed when finding the client's address; empty believes none. Example: 10.0.0.5/32"},
		conf.Option{Name: "rate", Kind: conf.KindFloat, Default: "50", Min: 0.001, Max: 1e6, HasRange: true,
			Help: "Requests per second the source may send (token bucket). Example: 50"},
		conf.Option{Name: "burst", Kind: conf.KindInt, Default: "100", Min: 1, Max: 1e6, HasRange: true,
			Help: "Requests the source may send at once above rate. Example: 100"},
		conf.Option{Name: "client_rate", Kind: conf.KindFloat, Default: "0", Min: 0, Max: 1e6, HasRange: true,
			Help: "Requests per second each client address may send; 0 means the same as rate. Example: 10"},
		conf.Option{Name: "client_burst", Kind: conf.KindInt, Default: "0", Min: 0, Max: 1e6, HasRange: true,
			Help: "Burst of each client address; 0 means the same as burst. Example: 20"},
		conf.Option{Name: "max_body_bytes", Kind: conf.KindInt, Default: "0", Min: 0, Max: 64 << 20, HasRange: true,
			Help: "Largest body accepted, enforced while reading (413 beyond); at least 256. 0: 65536 for format = native, " +
				"8388608 for format = alertmanager (Alertmanager drops a whole group on a 413: a group of 1,000 alerts is about " +
				"800 KB; cap it with max_alerts in its webhook_config). Example: 1048576"},
		conf.Option{Name: "callback_hosts", Kind: conf.KindList,
			Help: "Hosts a callback_url may name (exact names or addresses, or *.domain); empty refuses every callback_url. " +
				"Nothing else is ever contacted. Example: scheduler.example.org,*.jobs.example.org"},
		conf.Option{Name: "instance_label", Kind: conf.KindString, Default: webhook.DefaultInstanceLabel,
			Help: "With format = alertmanager: the alert label holding the Nova instance UUID; alerts without it are skipped. Example: instance_uuid"},
		conf.Option{Name: "alert_metrics", Kind: conf.KindList,
			Help: "With format = alertmanager: a firing alert's labels and annotations whose value is a number become the " +
				"policy's metrics under their own names (an annotation wins over a label); NAME:METRIC pairs rename them. " +
				"A resolved alert carries no metrics. Example: value:gpu_util,fb:fb_used_mib"},
		conf.Option{Name: "mtls_subjects", Kind: conf.KindList,
			Help: "With auth = mtls: client certificate subjects allowed, as a common name or a full subject. Example: CN=batch-scheduler,O=Example"},
		conf.Option{Name: "mtls_sans", Kind: conf.KindList,
			Help: "With auth = mtls: subject alternative names allowed (DNS, URI, e-mail or IP). Example: batch.example.org"},
		conf.Option{Name: "jwt_issuer", Kind: conf.KindString,
			Help: "With auth = jwt: the iss every token must carry, exactly. Example: https://keycloak.example.org/realms/hpc"},
		conf.Option{Name: "jwt_audience", Kind: conf.KindString,
			Help: "With auth = jwt: the value the token's aud (a string or an array) must hold: it binds a token to this " +
				"source. Empty: vgpu-bridge:webhook:NAME, NAME being the source's. Two jwt sources with the same jwt_issuer " +
				"must not share one (a token for one would be accepted by the other). Example: vgpu-bridge:webhook:batch-scheduler"},
		conf.Option{Name: "jwt_max_lifetime", Kind: conf.KindDuration, Default: webhook.DefaultJWTMaxLifetime.String(), Min: float64(time.Minute), Max: float64(webhook.MaxJWTMaxLifetime), HasRange: true,
			Help: "With auth = jwt: the longest a token may be valid for, from its iat (or nbf; from now without either) to " +
				"its exp; a longer-lived token is refused 401 (token_lifetime_too_long), so a leaked token is of use for a " +
				"bounded time. Example: 1h"},
		conf.Option{Name: "jwks_url", Kind: conf.KindString,
			Help: "With auth = jwt: the JWKS (the issuer's public keys), fetched over https (http only to a loopback host; " +
				"at most 1 MiB within 10 s; redirects are not followed) when first needed, again every jwks_refresh_interval, " +
				"and when a token names a kid the keys in hand lack, so a key rotation needs no restart. One fetch at a time: " +
				"requests that need it wait for it as long as they last, and tokens whose kid is in hand never wait; fetches " +
				"are at least 10 s apart, and after failures in a row back off up to 5 minutes. A failed fetch keeps the keys " +
				"in hand; with none, or for a kid they lack, tokens are refused 503 (jwks_unavailable, with Retry-After). " +
				"Set this or jwks_file. Example: https://keycloak.example.org/realms/hpc/protocol/openid-connect/certs"},
		conf.Option{Name: "jwks_file", Kind: conf.KindString,
			Help: "With auth = jwt: a file holding the JWKS, in place of jwks_url; read again when its modification time " +
				"or size changes (looked at once a second at most) and on SIGHUP. Example: /etc/vgpu-bridge/jwks/batch-scheduler.json"},
		conf.Option{Name: "jwks_refresh_interval", Kind: conf.KindDuration, Default: webhook.DefaultJWKSRefresh.String(), Min: float64(30 * time.Second), Max: float64(24 * time.Hour), HasRange: true,
			Help: "With jwks_url: the age at which the keys are fetched again (in the background; requests go on with " +
				"the keys in hand). Example: 5m"},
		conf.Option{Name: "jwt_leeway", Kind: conf.KindDuration, Default: "1m", Min: 0, Max: float64(webhook.MaxJWTLeeway), HasRange: true,
			Help: "With auth = jwt: the clock skew allowed when checking a token's exp, nbf and iat. Example: 1m"},
		conf.Option{Name: "jwt_projects_claim", Kind: conf.KindString,
			Help: "With auth = jwt: a claim (a Keystone project id or an array of them) that narrows allowed_projects per " +
				"token: the request acts only on instances of the token's projects (that are also in allowed_projects, " +
				"when that is set), others are refused 403 (project_not_allowed); a token without the claim is refused " +
				"401 (missing_projects_claim). The same projects narrow the requests the token reads (GET /v1/requests/{id}), and " +
				"each token's sub and projects have idempotency keys of their own. Empty: tokens are not narrowed. Example: projects"},
		conf.Option{Name: "timestamp_tolerance", Kind: conf.KindDuration, Default: webhook.DefaultTimestampTolerance.String(), Min: float64(10 * time.Second), Max: float64(time.Hour), HasRange: true,
			Help: "Standard Webhooks: the largest difference between webhook-timestamp and the bridge's clock. Example: 5m"},
	)

func validateWebhooks(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if l := optWHListen.Get(v); l != "" {
		if _, _, err := net.SplitHostPort(l); err != nil {
			errs = append(errs, &conf.Error{Section: "webhooks", Option: "listen", Value: l, Problem: "not host:port; allowed: e.g. 0.0.0.0:9443"})
		}
	}
	if (optWHTLSCert.Get(v) == "") != (optWHTLSKey.Get(v) == "") {
		errs = append(errs, &conf.Error{Section: "webhooks", Option: "tls_key_file", Value: optWHTLSKey.Get(v), Problem: "tls_cert_file and tls_key_file go together"})
	}
	shared := webhooksShareAPI(v)
	audiences := map[[2]string]string{} // a jwt source's issuer and audience → its name
	for _, in := range v.Instances(webhookSourcePrefix) {
		sec := webhookSourcePrefix + ":" + in.Name
		bad := func(opt, val, problem string) {
			errs = append(errs, &conf.Error{Section: sec, Option: opt, Value: val, Problem: problem})
		}
		auth := in.String("auth")
		switch auth {
		case "hmac":
			if len(in.List("secret_files")) == 0 {
				bad("secret_files", "", "is required with auth = hmac; allowed: files holding one secret each")
			}
		case "bearer":
			if len(in.List("token_files")) == 0 {
				bad("token_files", "", "is required with auth = bearer; allowed: files holding one token each")
			}
		case "jwt":
			if in.String("jwt_issuer") == "" {
				bad("jwt_issuer", "", "is required with auth = jwt; allowed: the iss of the tokens, e.g. https://keycloak.example.org/realms/hpc")
			}
			aud := cmp.Or(in.String("jwt_audience"), webhook.DefaultJWTAudience(in.Name))
			k := [2]string{in.String("jwt_issuer"), aud}
			if other, ok := audiences[k]; ok {
				bad("jwt_audience", aud, fmt.Sprintf("is [%s:%s]'s too, of the same jwt_issuer: a token for one would be accepted by the other; "+
					"allowed: an audience of this source's own, e.g. %s", webhookSourcePrefix, other, webhook.DefaultJWTAudience(in.Name)))
			}
			audiences[k] = in.Name
			switch u, f := in.String("jwks_url"), in.String("jwks_file"); {
			case u == "" && f == "":
				bad("jwks_url", "", "auth = jwt needs jwks_url or jwks_file")
			case u != "" && f != "":
				bad("jwks_file", f, "set jwks_url or jwks_file, not both")
			case u != "":
				if err := webhook.CheckJWKSURL(u); err != nil {
					bad("jwks_url", u, err.Error()+"; allowed: an https URL (http only to a loopback host), e.g. https://keycloak.example.org/realms/hpc/protocol/openid-connect/certs")
				}
			}
		case "mtls":
			if len(in.List("mtls_subjects"))+len(in.List("mtls_sans")) == 0 {
				bad("mtls_subjects", "", "auth = mtls needs mtls_subjects or mtls_sans")
			}
			if optWHClientCA.Get(v) == "" {
				bad("auth", auth, "auth = mtls needs [webhooks] client_ca_file")
			}
			if (shared && optAPITLSCert.Get(v) == "") || (!shared && optWHTLSCert.Get(v) == "") {
				bad("auth", auth, "auth = mtls needs TLS on the listener that serves webhooks")
			}
		}
		if in.String("format") == "alertmanager" && auth == "hmac" {
			bad("format", "alertmanager", "Alertmanager cannot sign: use auth = bearer, jwt or mtls")
		}
		if n := in.Int("max_body_bytes"); n != 0 && n < 256 {
			bad("max_body_bytes", strconv.Itoa(n), "must be 0 (by format) or at least 256")
		}
		for _, pair := range in.List("alert_metrics") {
			from, to, ok := strings.Cut(pair, ":")
			if !ok || strings.TrimSpace(from) == "" || !metricName.MatchString(strings.TrimSpace(to)) {
				bad("alert_metrics", pair, "not NAME:METRIC with METRIC a metric name; allowed: e.g. value:gpu_util")
			}
		}
		for _, opt := range []string{"allowed_cidrs", "trusted_proxies"} {
			for _, c := range in.List(opt) {
				if _, err := parsePrefix(c); err != nil {
					bad(opt, c, "not an address or CIDR; allowed: e.g. 10.0.0.0/8, 192.0.2.7, 2001:db8::/32")
				}
			}
		}
	}
	return errs
}

// metricName is what alert_metrics may name: a CEL identifier, so that
// rules can say metrics.NAME.
var metricName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxBody is max_body_bytes, 0 giving the format's default.
func maxBody(n int, format string) int64 {
	switch {
	case n > 0:
		return int64(n)
	case format == string(webhook.FormatAlertmanager):
		return 8 << 20
	}
	return 64 << 10
}

// parsePrefix reads a CIDR or a single address.
func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func webhooksShareAPI(v *conf.Values) bool {
	l := optWHListen.Get(v)
	return l == "" || l == optAPIListen.Get(v)
}

// WebhookSources reads the [webhook_source:NAME] sections and their
// secret and token files.
func WebhookSources(v *conf.Values) ([]webhook.Source, error) {
	var out []webhook.Source
	for _, in := range v.Instances(webhookSourcePrefix) {
		sec := "[" + webhookSourcePrefix + ":" + in.Name + "]"
		s := webhook.Source{
			Name: in.Name, Auth: webhook.Auth(in.String("auth")), Format: webhook.Format(in.String("format")),
			Rate: in.Float("rate"), Burst: in.Int("burst"), ClientRate: in.Float("client_rate"), ClientBurst: in.Int("client_burst"),
			MaxBodyBytes: maxBody(in.Int("max_body_bytes"), in.String("format")), CallbackHosts: in.List("callback_hosts"),
			InstanceLabel: in.String("instance_label"), MTLSSubjects: in.List("mtls_subjects"), MTLSSANs: in.List("mtls_sans"),
			TimestampTolerance: in.Duration("timestamp_tolerance"), AllowedProjects: in.List("allowed_projects"),
			JWTIssuer: in.String("jwt_issuer"), JWTAudience: in.String("jwt_audience"), JWKSURL: in.String("jwks_url"),
			JWKSFile: in.String("jwks_file"), JWKSRefresh: in.Duration("jwks_refresh_interval"), JWTLeeway: in.Duration("jwt_leeway"),
			JWTMaxLifetime:   in.Duration("jwt_max_lifetime"),
			JWTProjectsClaim: in.String("jwt_projects_claim"),
		}
		for _, pair := range in.List("alert_metrics") {
			from, to, _ := strings.Cut(pair, ":")
			if s.AlertMetrics == nil {
				s.AlertMetrics = map[string]string{}
			}
			s.AlertMetrics[strings.TrimSpace(from)] = strings.TrimSpace(to)
		}
		for _, f := range in.List("secret_files") {
			text, err := conf.ReadSecretFile(f)
			if err != nil {
				return nil, fmt.Errorf("%s secret_files: %w", sec, err)
			}
			k, err := webhook.SecretKey(text)
			if err != nil {
				return nil, fmt.Errorf("%s secret_files: %s: %w", sec, f, err)
			}
			s.Secrets = append(s.Secrets, k)
		}
		for _, f := range in.List("token_files") {
			t, err := conf.ReadSecretFile(f)
			if err != nil {
				return nil, fmt.Errorf("%s token_files: %w", sec, err)
			}
			if len(t) < 16 {
				return nil, fmt.Errorf("%s token_files: %s: a token must be at least 16 characters", sec, f)
			}
			s.Tokens = append(s.Tokens, t)
		}
		for _, c := range in.List("allowed_cidrs") {
			p, err := parsePrefix(c)
			if err != nil {
				return nil, fmt.Errorf("%s allowed_cidrs: %q: %w", sec, c, err)
			}
			s.AllowedCIDRs = append(s.AllowedCIDRs, p)
		}
		for _, c := range in.List("trusted_proxies") {
			p, err := parsePrefix(c)
			if err != nil {
				return nil, fmt.Errorf("%s trusted_proxies: %q: %w", sec, c, err)
			}
			s.TrustedProxies = append(s.TrustedProxies, p)
		}
		out = append(out, s)
	}
	return out, nil
}

// WebhookConfig is webhook.Config (the endpoint's [webhooks] options are
// package webhook's) with the sources and a commit timeout of two thirds
// of write_timeout (without store, pool, registry and logger).
func WebhookConfig(v *conf.Values) (webhook.Config, error) {
	srcs, err := WebhookSources(v)
	if err != nil {
		return webhook.Config{}, err
	}
	c := webhook.ConfigFrom(v)
	c.Sources = srcs
	c.CommitTimeout = optWHWriteTimeout.Get(v) * 2 / 3
	c.ProjectRate, c.ProjectBurst = optAPIProjectRate.Get(v), optAPIProjectBurst.Get(v)
	return c, nil
}

func loadClientCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("[webhooks] client_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("[webhooks] client_ca_file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// setupWebhooks builds the request store, its routes and the webhook
// endpoint. Routes go on srv (the operator API), and on a second listener
// when [webhooks] listen names another address. apiTLS is the API's TLS
// configuration (nil without TLS); with a shared listener the webhook
// client CA is added to it before the API starts.
func setupWebhooks(w *wiring, ac api.Config) ([]component, error) {
	v, pool, srv, reg, log, rl := w.v, w.pool, w.srv, w.reg, w.log, w.rl
	store := requests.NewStore(pool, "vgpu-bridge")
	wc, err := WebhookConfig(v)
	if err != nil {
		return nil, err
	}
	wc.Store, wc.Pool, wc.Registerer, wc.Logger = store, pool, reg, log.With("component", "webhooks")
	wc.OnCommitted = w.wake.Wake // accepted events are decided at once, not at the next poll
	if l := instanceLookup(w); l != nil {
		wc.Lookup = l // a project's caller naming a server the bridge does not know yet: asked of Nova
	}
	ep, err := webhook.New(wc)
	if err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	rl.setWebhooks(ep)
	var cas *x509.CertPool
	if f := optWHClientCA.Get(v); f != "" {
		if cas, err = loadClientCAs(f); err != nil {
			return nil, err
		}
	}
	h := requests.NewHandler(store, ac.Auth, ep, log.With("component", "requests"))
	h.Register(srv)
	w.reqAPI = h
	ep.RegisterOperator(srv) // POST /v1/requests: a request with API credentials
	comps := []component{{name: "webhooks", run: ep.Run}}
	if webhooksShareAPI(v) {
		if cas != nil && ac.TLSConfig != nil {
			// The server holds the same *tls.Config; it is read when the
			// API starts listening, after this.
			if ac.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert {
				// [api] tls_client_ca_file: every client needs a
				// certificate; webhook senders' CAs are trusted too.
				pem, _ := os.ReadFile(optWHClientCA.Get(v))
				ac.TLSConfig.ClientCAs.AppendCertsFromPEM(pem)
			} else {
				ac.TLSConfig.ClientCAs = cas
				ac.TLSConfig.ClientAuth = tls.VerifyClientCertIfGiven
			}
		}
		ep.Register(srv)
		return comps, nil
	}
	wcfg := api.Config{
		Listen:            optWHListen.Get(v),
		ReadHeaderTimeout: optWHReadHeaderTimeout.Get(v),
		ReadTimeout:       optWHReadTimeout.Get(v),
		WriteTimeout:      optWHWriteTimeout.Get(v),
		IdleTimeout:       optWHIdleTimeout.Get(v),
		MaxHeaderBytes:    optWHMaxHeaderBytes.Get(v),
		ShutdownGrace:     optShutdownTimeout.Get(v),
		DisableByFile:     ac.DisableByFile, // one switch takes the bridge out of every pool
		Auth:              ac.Auth,
		Policy:            ac.Policy, // GET /v1/requests/{id} with operator credentials
		// Its own registry: the listener's HTTP histogram would collide
		// with the API's; the webhook metrics themselves are on reg.
		Registry: prometheus.NewRegistry(),
		Logger:   log.With("component", "webhook-listener"),
		Version:  Version,
	}
	if cert := optWHTLSCert.Get(v); cert != "" {
		tc, err := serverTLS(cert, optWHTLSKey.Get(v))
		if err != nil {
			return nil, fmt.Errorf("[webhooks] tls_cert_file: %w", err)
		}
		wcfg.TLSConfig = tc
		rl.webhookListener(tc)
		if cas != nil {
			wcfg.TLSConfig.ClientCAs = cas
			wcfg.TLSConfig.ClientAuth = tls.VerifyClientCertIfGiven
		}
	}
	wsrv := api.New(wcfg)
	wsrv.AddCheck("database", func(ctx context.Context) error { return pool.Ping(ctx) })
	ep.Register(wsrv)
	h.RegisterStatus(wsrv)
	wsrv.Describe(requests.StatusFragment())
	comps = append(comps, component{name: "webhook-listener", run: wsrv.Run})
	return comps, nil
}
