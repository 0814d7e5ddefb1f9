package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// TestNovaStyleConfig: an agent.conf holding sections pasted from
// nova-compute's nova.conf loads, [oslo_messaging_rabbit]'s TLS files are
// the agent's [amqp] ones, and every other oslo option is named in one
// warning per section.
func TestNovaStyleConfig(t *testing.T) {
	v, err := LoadConfig(conf.Source{File: "testdata/nova-style.conf"})
	if err != nil {
		t.Fatal(err)
	}
	want := conf.TLSFiles{CAFile: "/etc/ssl/rabbitmq/ca.pem", CertFile: "/etc/ssl/rabbitmq/compute.crt", KeyFile: "/etc/ssl/rabbitmq/compute.key"}
	if got := tlsFiles(v); got != want {
		t.Errorf("[amqp] TLS files %+v, want %+v", got, want)
	}
	// nova.conf's ssl = True makes the plain rabbit:// URL a TLS one, as
	// in oslo.messaging (impl_rabbit.Connection._fetch_ssl_params).
	if tu, err := TransportURL(v); err != nil || !tu.TLS || tu.AMQPURLs()[0][:8] != "amqps://" {
		t.Errorf("[oslo_messaging_rabbit] ssl = True: transport %+v, %v; want TLS", tu, err)
	}
	if got := diagnosticsFrom(v).LogFile; got != "/var/log/kolla/vgpu-agent/agent.log" {
		t.Errorf("the bundle's log file is %q, want [DEFAULT] log_dir/log_file", got)
	}
	if Host(v) != "compute-0012" || Debug(v) {
		t.Errorf("[DEFAULT] host %q debug %v", Host(v), Debug(v))
	}
	warnings := []string{
		"[DEFAULT] control_exchange, use_stderr: ignored",
		"[keystone_authtoken] auth_type, password, www_authenticate_uri: ignored",
		"[notifications] notification_format: ignored",
		"[oslo_messaging_notifications] driver, transport_url: ignored",
		"[oslo_messaging_rabbit] amqp_durable_queues, heartbeat_timeout_threshold, rabbit_quorum_queue: ignored",
	}
	if len(v.Warnings) != len(warnings) {
		t.Fatalf("warnings:\n%s\nwant %d", strings.Join(v.Warnings, "\n"), len(warnings))
	}
	for i, w := range warnings {
		if !strings.Contains(v.Warnings[i], w) {
			t.Errorf("warning %q lacks %q", v.Warnings[i], w)
		}
	}
}

// TestNovaStyleConfigRefused: the TLS file set under both names to
// different values, or a typo in the agent's own section, is refused.
func TestNovaStyleConfigRefused(t *testing.T) {
	base, err := os.ReadFile("testdata/nova-style.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, extra, want string }{
		{"two names, two values", "\n[amqp]\nssl_ca_file = /etc/ssl/other.pem\n",
			`[oslo_messaging_rabbit] ssl_ca_file = "/etc/ssl/rabbitmq/ca.pem": conflicts with [amqp] ssl_ca_file = "/etc/ssl/other.pem"`},
		{"typo in our section", "\n[amqp]\nssl_server_nam = rabbit\n", "did you mean ssl_server_name?"},
		{"typo in [DEFAULT]", "\n[DEFAULT]\nreport_intervall = 1m\n", "[DEFAULT] report_intervall"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "agent.conf")
			if err := os.WriteFile(p, append(append([]byte(nil), base...), tc.extra...), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadConfig(conf.Source{File: p})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
