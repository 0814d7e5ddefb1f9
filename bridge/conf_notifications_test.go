package bridge

import (
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testpki"
)

// TestBrokerTLS: one TLS configuration serves every broker connection
// whose URL uses TLS, built from the [notifications] ssl_* files even when
// the notifications' own broker is plain (the commands' broker on
// rabbit+ssl:// must still be verified against ssl_ca_file, not the
// system's roots); none is built, and no file read, when no URL uses TLS.
func TestBrokerTLS(t *testing.T) {
	ca := testpki.NewCA(t, t.TempDir(), "rabbit").File
	base := []string{"database.connection=postgres://u@h/db", "api.auth_strategy=noauth"}
	for _, c := range []struct {
		name        string
		overrides   []string
		wantTLS     [3]bool // [DEFAULT], [notifications], [oslo_messaging_notifications]
		wantConfig  bool
		wantProblem string
	}{
		{name: "all plain", overrides: []string{"DEFAULT.transport_url=rabbit://g:g@h:5672/", "notifications.ssl_ca_file=/nonexistent"}},
		{name: "commands over TLS, notifications plain",
			overrides: []string{"DEFAULT.transport_url=rabbit+ssl://g:g@h:5671/", "notifications.transport_url=rabbit://g:g@n:5672/",
				"notifications.ssl_ca_file=" + ca},
			wantTLS: [3]bool{true, false, false}, wantConfig: true},
		{name: "ssl set, plain URLs", overrides: []string{"DEFAULT.transport_url=rabbit://g:g@h:5671/",
			"notifications.transport_url=rabbit://g:g@n:5671/", "oslo_messaging_notifications.transport_url=amqp://g:g@o:5671/",
			"notifications.ssl=true", "notifications.ssl_ca_file=" + ca},
			wantTLS: [3]bool{true, true, true}, wantConfig: true},
		{name: "ssl set, CA file missing", overrides: []string{"DEFAULT.transport_url=rabbit://g:g@h:5671/",
			"notifications.ssl=true", "notifications.ssl_ca_file=/nonexistent"},
			wantTLS: [3]bool{true, true, true}, wantProblem: "[notifications] ssl_*"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := LoadConfig(conf.Source{Overrides: append(append([]string{}, base...), c.overrides...)})
			if err != nil {
				t.Fatal(err)
			}
			tu, err := TransportURL(v)
			if err != nil {
				t.Fatal(err)
			}
			ntu, _, err := NotificationsTransportURL(v)
			if err != nil {
				t.Fatal(err)
			}
			otu, err := OutTransportURL(v, ntu)
			if err != nil {
				t.Fatal(err)
			}
			if got := [3]bool{tu.TLS, ntu.TLS, otu.TLS}; got != c.wantTLS {
				t.Errorf("TLS of the three brokers %v, want %v", got, c.wantTLS)
			}
			tc, err := BrokerTLS(v, tu, ntu, otu)
			switch {
			case c.wantProblem != "":
				if err == nil || !strings.Contains(err.Error(), c.wantProblem) {
					t.Errorf("BrokerTLS error %v, want one naming %s", err, c.wantProblem)
				}
			case err != nil:
				t.Fatal(err)
			case (tc != nil) != c.wantConfig:
				t.Errorf("TLS config %v, want one: %v", tc, c.wantConfig)
			case tc != nil && tc.RootCAs == nil:
				t.Error("the TLS config does not carry ssl_ca_file's roots")
			}
		})
	}
}
