package bridge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// TestNovaStyleConfig: a bridge.conf holding sections pasted from
// nova.conf loads, its oslo names set the bridge's options, and the oslo
// options the bridge has no use for are named in one warning per section.
func TestNovaStyleConfig(t *testing.T) {
	v, err := LoadConfig(conf.Source{File: "testdata/nova-style.conf"})
	if err != nil {
		t.Fatal(err)
	}
	kc := keystoneauth.ConfigFrom(v)
	ic := ingest.ConfigFrom(v)
	nc := notify.ConfigFrom(v)
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"[keystone] www_authenticate_uri", kc.ChallengeURI, "https://keystone.example.org:5000"},
		{"[keystone] cache_ttl (token_cache_time)", kc.CacheTTL, 10 * time.Minute},
		{"[keystone] timeout (http_connect_timeout)", kc.Timeout, 5 * time.Second},
		{"[notifications] ssl_ca_file", optNotifSSLCA.Get(v), "/etc/ssl/rabbitmq/ca.pem"},
		{"[notifications] ssl_cert_file", optNotifSSLCert.Get(v), "/etc/ssl/rabbitmq/nova.crt"},
		{"[notifications] ssl_key_file", optNotifSSLKey.Get(v), "/etc/ssl/rabbitmq/nova.key"},
		{"[notifications] exchange_durable (amqp_durable_queues)", ic.ExchangeDurable, true},
		{"[notifications] quorum_queue (rabbit_quorum_queue)", ic.QuorumQueue, true},
		{"[dispatch] quorum_queues (rabbit_quorum_queue)", dispatch.ConfigFrom(v).QuorumQueues, true},
		{"[notifications] topics (versioned_notifications_topics)", strings.Join(ic.BindingKeys, ","), "versioned_notifications.info,versioned_notifications.error"},
		{"[oslo_messaging_notifications] exchange_durable (amqp_durable_queues)", nc.ExchangeDurable, true},
		{"[oslo_messaging_notifications] topics", strings.Join(nc.Topics, ","), "notifications"},
		{"[DEFAULT] debug", Debug(v), true},
		{"log file (log_dir)", LogFile(v), "/var/log/kolla/vgpu-bridge/vgpu-bridge.log"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// The credentials the bridge validates tokens with: the section's,
	// not [openstack] cloud's.
	cloud := keystoneCredentialsCloud(v)
	if a := cloud.AuthInfo; a.AuthURL != "https://keystone-internal.example.org:5000" || a.Username != "nova" ||
		a.Password != "secret" || a.ProjectName != "service" || a.UserDomainName != "Default" ||
		a.ProjectDomainName != "Default" || cloud.AuthType != "password" || cloud.CACertFile != "/etc/ssl/certs/ca-bundle.pem" ||
		cloud.RegionName != "RegionOne" {
		t.Errorf("[keystone] credentials: %+v %+v", cloud, *a)
	}
	tu, err := TransportURL(v)
	if err != nil || len(tu.Brokers) != 2 || tu.Brokers[1].Host != "rabbit2:5671" {
		t.Errorf("transport_url: %+v, %v", tu, err)
	}
	// nova.conf's ssl = True makes the plain rabbit:// URL a TLS one, as in
	// oslo.messaging (impl_rabbit.Connection._fetch_ssl_params), for each
	// broker connection of the bridge.
	ntu, _, nerr := NotificationsTransportURL(v)
	otu, oerr := OutTransportURL(v, ntu)
	if err != nil || nerr != nil || oerr != nil || !tu.TLS || !ntu.TLS || !otu.TLS {
		t.Errorf("[oslo_messaging_rabbit] ssl = True: TLS %v %v %v (%v %v %v), want TLS for all", tu.TLS, ntu.TLS, otu.TLS, err, nerr, oerr)
	}
	want := []string{
		"[DEFAULT] control_exchange, log_date_format, use_stderr: ignored",
		"[keystone_authtoken] memcached_servers, service_token_roles_required: ignored",
		"[notifications] notification_format, notify_on_state_change: ignored",
		"[oslo_messaging_notifications] retry: ignored",
		"[oslo_messaging_rabbit] heartbeat_in_pthread, heartbeat_timeout_threshold, kombu_reconnect_delay: ignored",
	}
	if len(v.Warnings) != len(want) {
		t.Fatalf("warnings:\n%s\nwant %d", strings.Join(v.Warnings, "\n"), len(want))
	}
	for i, w := range want {
		if !strings.Contains(v.Warnings[i], w) {
			t.Errorf("warning %q lacks %q", v.Warnings[i], w)
		}
	}
	for _, w := range v.Warnings {
		if strings.Contains(w, "secret") {
			t.Errorf("a warning shows a value: %q", w)
		}
	}
}

// TestNovaStyleConfigRefused: the same file with an option set under both
// names to different values, or with a typo in a section of the bridge's
// own, is refused, the error naming what is wrong.
func TestNovaStyleConfigRefused(t *testing.T) {
	base, err := os.ReadFile("testdata/nova-style.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, extra, want string
		dropIn            bool
	}{
		{"two names, two values", "\n[keystone]\ncache_ttl = 1m\n",
			`[keystone_authtoken] token_cache_time = "600": conflicts with [keystone] cache_ttl = "1m"`, false},
		{"two names, two values in a drop-in", "\n[notifications]\nquorum_queue = false\n",
			"[oslo_messaging_rabbit] rabbit_quorum_queue = \"True\": conflicts with [notifications] quorum_queue", true},
		{"typo in our section", "\n[keystone]\nadmin_role = admin\n", "[keystone] admin_role", false},
		{"credentials without a password", "\n[keystone_authtoken]\npassword =\n",
			"[keystone] password = \"\": is required with auth_url and auth_type = password ([keystone_authtoken] password in nova.conf)", false},
		{"application credential without its secret", "\n[keystone_authtoken]\nauth_type = v3applicationcredential\napplication_credential_id = 21dc\n",
			"[keystone] application_credential_secret = \"\": is required", false},
		{"typo in a section shared with oslo", "\n[oslo_messaging_notifications]\ndrvier = noop\n", "[oslo_messaging_notifications] drvier", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := conf.Source{File: filepath.Join(dir, "bridge.conf")}
			body, extra := append([]byte(nil), base...), []byte(tc.extra)
			if tc.dropIn {
				src.Dir = filepath.Join(dir, "bridge.conf.d")
				if err := os.Mkdir(src.Dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(src.Dir, "10-queues.conf"), extra, 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				body = append(body, extra...)
			}
			if err := os.WriteFile(src.File, body, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadConfig(src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestNovaStyleNotificationsBroker: nova.conf's [oslo_messaging_notifications]
// transport_url, pasted, is where the bridge publishes; as Nova sends its
// notifications there, the bridge warns when it still reads them from
// [DEFAULT] transport_url, and not once [notifications] transport_url says
// where to read them.
func TestNovaStyleNotificationsBroker(t *testing.T) {
	base, err := os.ReadFile("testdata/nova-style.conf")
	if err != nil {
		t.Fatal(err)
	}
	const notify = "rabbit://nova:secret@notify1:5671/"
	for _, tc := range []struct {
		name, extra string
		warned      bool
	}{
		{"pasted alone", "\n[oslo_messaging_notifications]\ntransport_url = " + notify + "\n", true},
		{"consumer told", "\n[oslo_messaging_notifications]\ntransport_url = " + notify + "\n[notifications]\ntransport_url = " + notify + "\n", false},
		{"same broker as [DEFAULT]", "\n[oslo_messaging_notifications]\ntransport_url = rabbit://nova:secret@rabbit1:5671,nova:secret@rabbit2:5671/\n", false},
		{"not set", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bridge.conf")
			if err := os.WriteFile(p, append(append([]byte(nil), base...), tc.extra...), 0o600); err != nil {
				t.Fatal(err)
			}
			v, err := LoadConfig(conf.Source{File: p})
			if err != nil {
				t.Fatal(err)
			}
			warned := strings.Contains(strings.Join(v.Warnings, "\n"), "set [notifications] transport_url to it")
			if warned != tc.warned {
				t.Errorf("warned %v, want %v: %q", warned, tc.warned, v.Warnings)
			}
			if strings.Contains(strings.Join(v.Warnings, "\n"), "notify1") {
				t.Error("a warning shows the URL")
			}
		})
	}
}
