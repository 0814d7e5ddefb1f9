package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Reload (SIGHUP) swaps the secrets of a running bridge without closing a
// listener or a connection:
//
//   - [api] token_file (auth_strategy = token): the operator API's tokens;
//   - [api] and [webhooks] tls_cert_file / tls_key_file: the listeners'
//     certificates (used from the next TLS handshake);
//   - every [webhook_source:NAME] secret_files and token_files;
//   - [security] signing_key_file with key_id (the next commands are signed
//     with the new key) and agent_keys_file;
//   - [policy] rules_file: a new path is read (checked first, like the
//     secrets); the file in use is read again on SIGHUP anyway;
//   - [oslo_policy] policy_file: the access rules are read again (from a
//     new path too), checked first; tokens already validated are judged by
//     the new rules from their next request (keystoneauth keeps what
//     Keystone said of a token, not what the rules made of it).
//
// Every other option whose value changed is logged at warning level by
// name, "changed; needs a restart", and keeps its start value.
//
// A reload is all or nothing: every new file is read and checked first,
// and one that fails keeps every secret in use and logs why. What cannot
// change in a running process (listen addresses, auth_strategy, TLS on or
// off, the set of webhook sources and their auth, [DEFAULT]
// transport_url, [database] connection) is logged as needing a restart
// and keeps its start value; replicas are restarted one at a time for
// those (see README, "Rotating secrets").

// reloader holds the swappable parts of one Run.
type reloader struct {
	mu      sync.Mutex // one reload at a time
	log     *slog.Logger
	start   *conf.Values // the configuration Run started with
	reloads *prometheus.CounterVec

	auth     *swapAuth // nil unless auth_strategy = token
	apiCert  *certHolder
	whCert   *certHolder
	webhooks *webhook.Endpoint
	disp     *dispatch.Dispatcher
	policy   *policy.Holder
	access   *api.Policy // the API's access rules, replaced in place
}

func newReloader(v *conf.Values, reg prometheus.Registerer, log *slog.Logger) *reloader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &reloader{log: log.With("component", "reload"), start: v,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_reloads_total",
			Help: "Reloads of secrets and keys (SIGHUP), by outcome: ok, or failed (every secret in use stays)."},
			[]string{logkey.Outcome})}
	if reg != nil {
		reg.MustRegister(r.reloads)
	}
	return r
}

// api makes ac's authenticator and certificate swappable; Run calls it
// before the API server is built.
func (r *reloader) api(v *conf.Values, ac *api.Config) {
	if optAPIAuth.Get(v) == "token" && ac.Auth != nil {
		r.auth = &swapAuth{}
		r.auth.cur.Store(&authBox{ac.Auth})
		ac.Auth = r.auth
	}
	if ac.TLSConfig != nil && len(ac.TLSConfig.Certificates) == 1 {
		r.apiCert = newCertHolder(ac.TLSConfig)
	}
	r.access = ac.Policy
}

// webhookListener makes the separate webhook listener's certificate
// swappable.
func (r *reloader) webhookListener(c *tls.Config) {
	if r != nil && c != nil && len(c.Certificates) == 1 {
		r.whCert = newCertHolder(c)
	}
}

// setWebhooks and setDispatcher register the parts whose credentials a
// reload replaces.
func (r *reloader) setWebhooks(ep *webhook.Endpoint) {
	if r != nil {
		r.webhooks = ep
	}
}

// setPolicy lets a reload apply a new [policy] rules_file.
func (r *reloader) setPolicy(h *policy.Holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.policy = h
}

func (r *reloader) setDispatcher(d *dispatch.Dispatcher) {
	if r != nil {
		r.disp = d
	}
}

// Reload re-reads the secrets named by v (the configuration file loaded
// again, or the one Run started with: same paths, new contents) and
// swaps them in at once; on error nothing changes. It is what SIGHUP
// does (ReloadOnSignal).
func (d *Daemon) Reload(v *conf.Values) error {
	if d == nil || d.reload == nil {
		return errors.New("reload: the bridge is not running")
	}
	return d.reload.reload(v)
}

// ReloadOnSignal reloads on every SIGHUP until ctx ends: load reads the
// configuration again (the same file, environment and flags); a file
// that does not load keeps everything in use.
func (d *Daemon) ReloadOnSignal(ctx context.Context, load func() (*conf.Values, error)) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			v, err := load()
			if err != nil {
				d.reload.reloads.WithLabelValues("failed").Inc()
				d.reload.log.Error("SIGHUP: the configuration does not load; keeping every secret in use",
					"err", err.Error())
				continue
			}
			_ = d.Reload(v)
		}
	}
}

// staged is everything a reload would install.
type staged struct {
	auth     api.Authenticator
	apiCert  *tls.Certificate
	whCert   *tls.Certificate
	sources  []webhook.Source
	keys     *dispatch.Keys
	rules    string      // a new [policy] rules_file, checked
	access   *api.Policy // the access rules read again
	changed  []string
	restarts []string
}

func (r *reloader) reload(v *conf.Values) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := r.stage(v)
	if err != nil {
		r.reloads.WithLabelValues("failed").Inc()
		r.log.Error("reload refused; keeping every secret in use", "err", err.Error())
		return fmt.Errorf("reload: %w", err)
	}
	// Install: each swap is one atomic store; readers see the old or the
	// new value, never a mix within one part.
	if s.auth != nil {
		r.auth.cur.Store(&authBox{s.auth})
	}
	if s.apiCert != nil {
		r.apiCert.cur.Store(s.apiCert)
	}
	if s.whCert != nil {
		r.whCert.cur.Store(s.whCert)
	}
	if s.sources != nil {
		// Checked in stage: cannot fail here.
		if err := r.webhooks.SetCredentials(s.sources); err != nil {
			r.log.Error("reload: webhook credentials", "err", err.Error())
		}
	}
	if s.keys != nil {
		if err := r.disp.SetKeys(*s.keys); err != nil {
			r.log.Error("reload: [security] keys", "err", err.Error())
		}
	}
	if s.access != nil {
		r.access.Replace(s.access)
	}
	if s.rules != "" {
		// Checked in stage; a file broken since keeps the active policy.
		if err := r.policy.SetRulesFile(s.rules); err != nil {
			r.log.Error("reload: [policy] rules_file", "err", err.Error())
		}
	}
	r.reloads.WithLabelValues("ok").Inc()
	attrs := []any{logkey.Changed, s.changed}
	if s.keys != nil && s.keys.Signer != nil {
		attrs = append(attrs, "key_id", s.keys.Signer.KeyID())
	}
	for _, name := range s.restarts {
		r.log.Warn(name+" changed; needs a restart (the value the bridge started with stays in use)", "option", name)
	}
	if len(s.restarts) > 0 {
		attrs = append(attrs, logkey.NeedsRestart, s.restarts)
		r.log.Warn("secrets reloaded; some changed options take effect only after a restart", attrs...)
	} else {
		r.log.Info("secrets reloaded", attrs...)
	}
	return nil
}

// stage reads and checks every secret of v without installing any.
func (r *reloader) stage(v *conf.Values) (*staged, error) {
	s := &staged{}
	var errs []error
	// What a running process cannot change.
	for _, o := range []conf.String{optAPIListen, optAPIAuth, optWHListen, optDBConnection, optDBConnectionFile,
		optTransportURL, optTransportURLFile} {
		if o.Get(v) != o.Get(r.start) {
			s.restarts = append(s.restarts, "["+o.Option().Section+"] "+o.Option().Name)
		}
	}
	if (optAPITLSCert.Get(v) == "") != (optAPITLSCert.Get(r.start) == "") {
		s.restarts = append(s.restarts, "[api] tls_cert_file (TLS on or off)")
	}
	if (optWHTLSCert.Get(v) == "") != (optWHTLSCert.Get(r.start) == "") {
		s.restarts = append(s.restarts, "[webhooks] tls_cert_file (TLS on or off)")
	}
	if optAPIClientCA.Get(v) != optAPIClientCA.Get(r.start) || optWHClientCA.Get(v) != optWHClientCA.Get(r.start) {
		s.restarts = append(s.restarts, "client CA files")
	}

	if r.auth != nil && optAPIAuth.Get(v) == "token" {
		st, err := api.LoadTokenFile(optAPITokenFile.Get(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("[api] token_file: %w", err))
		} else {
			s.auth = st
			s.changed = append(s.changed, "[api] token_file")
		}
	}
	if r.apiCert != nil && optAPITLSCert.Get(v) != "" {
		pair, err := tls.LoadX509KeyPair(optAPITLSCert.Get(v), optAPITLSKey.Get(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("[api] tls_cert_file: %w", err))
		} else {
			s.apiCert = &pair
			s.changed = append(s.changed, "[api] tls_cert_file")
		}
	}
	if r.whCert != nil && optWHTLSCert.Get(v) != "" {
		pair, err := tls.LoadX509KeyPair(optWHTLSCert.Get(v), optWHTLSKey.Get(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("[webhooks] tls_cert_file: %w", err))
		} else {
			s.whCert = &pair
			s.changed = append(s.changed, "[webhooks] tls_cert_file")
		}
	}
	if r.webhooks != nil {
		srcs, err := WebhookSources(v)
		if err == nil {
			err = r.webhooks.CheckCredentials(srcs)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("webhook sources: %w", err))
		} else {
			s.sources = srcs
			if len(srcs) > 0 {
				s.changed = append(s.changed, "[webhook_source:*] secret_files, token_files")
			}
		}
	}
	if r.disp != nil {
		var dc dispatch.Config
		if err := SecurityConfig(v, &dc, nil); err != nil {
			errs = append(errs, err)
		} else {
			k := dispatch.Keys{Signer: dc.Signer, Keyring: dc.Keyring, KeyringFile: dc.KeyringFile, RequireSigned: dc.RequireSigned}
			if old := r.disp.Keys(); old.Signer != nil && k.Signer == nil {
				errs = append(errs, errors.New("[security] signing_key_file is now empty: a reload does not turn command signing off (restart for that)"))
			}
			s.keys = &k
			if k.Signer != nil || k.Keyring != nil {
				s.changed = append(s.changed, "[security] signing_key_file, key_id, agent_keys_file")
			}
		}
	}
	if r.access != nil && (optAccessPolicyFile.Get(v) != "" || optAccessPolicyFile.Get(r.start) != "") {
		// The role names the base rules' defaults are written with stay
		// the start's ([keystone] *_roles need a restart).
		pol, err := api.LoadPolicy(accessRoleNames(r.start), optAccessPolicyFile.Get(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("[oslo_policy] policy_file: %w", err))
		} else {
			s.access = pol
			s.changed = append(s.changed, "[oslo_policy] policy_file")
		}
	}
	if r.policy != nil {
		// A new rules file is read from its new path, not the old one.
		if path, _ := RulesFile(v); path != r.policy.RulesFile() {
			if err := r.policy.Check(path); err != nil {
				errs = append(errs, fmt.Errorf("[policy] rules_file: %w", err))
			} else {
				s.rules = path
				s.changed = append(s.changed, "[policy] rules_file")
			}
		}
	}
	// Every other option whose value changed is reported: nothing is
	// taken silently as if applied.
	for _, name := range v.Changed(r.start) {
		if reloadable(name) || (name == "[policy] rules_file" && r.policy != nil) ||
			(name == "[oslo_policy] policy_file" && r.access != nil) || slices.ContainsFunc(s.restarts, func(x string) bool { return strings.HasPrefix(x, name) }) {
			continue
		}
		s.restarts = append(s.restarts, name)
	}
	slices.Sort(s.restarts)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// reloadable reports whether a reload applies a change of the option
// named "[section] name" (Values.Changed): the secrets' files it re-reads.
// [policy] rules_file is applied too when the bridge runs a policy (stage).
// Everything else keeps its start value until a restart.
func reloadable(name string) bool {
	switch name {
	case "[api] token_file", "[api] tls_cert_file", "[api] tls_key_file",
		"[webhooks] tls_cert_file", "[webhooks] tls_key_file",
		"[security] signing_key_file", "[security] key_id", "[security] agent_keys_file":
		return true
	}
	if rest, ok := strings.CutPrefix(name, "[webhook_source:"); ok {
		return strings.HasSuffix(rest, "] secret_files") || strings.HasSuffix(rest, "] token_files")
	}
	return false
}

// swapAuth is an api.Authenticator whose implementation a reload swaps.
type swapAuth struct{ cur atomic.Pointer[authBox] }

type authBox struct{ a api.Authenticator }

var _ api.Authenticator = (*swapAuth)(nil)

// Authenticate implements api.Authenticator.
func (s *swapAuth) Authenticate(r *http.Request) (*api.Principal, error) {
	return s.cur.Load().a.Authenticate(r)
}

// certHolder serves a listener's certificate through GetCertificate, so
// a reload renews it for the next handshakes.
type certHolder struct {
	cur atomic.Pointer[tls.Certificate]
}

// newCertHolder moves c's only certificate into a holder c reads from.
func newCertHolder(c *tls.Config) *certHolder {
	h := &certHolder{}
	cert := c.Certificates[0]
	h.cur.Store(&cert)
	c.Certificates = nil
	c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return h.cur.Load(), nil }
	return h
}
