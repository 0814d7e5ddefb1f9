package conf

import (
	"strings"
	"testing"
	"time"
)

func osloTestSet() (*Set, String, Bool, Bool, Duration) {
	g := NewGroup()
	ca := g.String("amqp", "ssl_ca_file", "", "CA. Example: /ca.pem").Also("oslo_messaging_rabbit", "ssl_ca_file")
	q1 := g.Bool("notifications", "quorum_queue", false, "Quorum. Example: true").Also("oslo_messaging_rabbit", "rabbit_quorum_queue")
	q2 := g.Bool("dispatch", "quorum_queues", false, "Quorum. Example: true").Also("oslo_messaging_rabbit", "rabbit_quorum_queue")
	ttl := g.Duration("keystone", "cache_ttl", 5*time.Minute, 0, time.Hour, "TTL. Example: 5m").
		Also("keystone_authtoken", "token_cache_time").Also("keystone_authtoken", "cache_ttl_alias")
	g.List("notifications", "topics", "versioned_notifications", "Topics. Example: a,b").
		Also("notifications", "versioned_notifications_topics")
	g.Bool(DefaultSection, "debug", false, "Debug. Example: true")
	return NewSet("VGPU_TEST", g), ca, q1, q2, ttl
}

// TestOsloNames: a file written with nova.conf's section and option names
// sets our options, one oslo name may set several of ours, the rest of
// the oslo sections is ignored with one warning per section, and a typo in
// a section of our own is still refused.
func TestOsloNames(t *testing.T) {
	s, ca, q1, q2, ttl := osloTestSet()
	file := writeFile(t, `[DEFAULT]
debug = True
use_stderr = false
log_date_format = %Y-%m-%d %H:%M:%S

[oslo_messaging_rabbit]
ssl_ca_file = /etc/ssl/rabbit-ca.pem
rabbit_quorum_queue = true
heartbeat_timeout_threshold = 60
kombu_reconnect_delay = 1.0

[keystone_authtoken]
token_cache_time = 600
auth_type = password
memcached_servers = 10.0.0.1:11211

[notifications]
notification_format = versioned
versioned_notifications_topics = versioned_notifications,vgpu
`)
	v, err := s.Load(Source{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if got := ca.Get(v); got != "/etc/ssl/rabbit-ca.pem" {
		t.Errorf("[amqp] ssl_ca_file = %q", got)
	}
	if !q1.Get(v) || !q2.Get(v) {
		t.Errorf("rabbit_quorum_queue set quorum_queue=%v quorum_queues=%v, want both", q1.Get(v), q2.Get(v))
	}
	if got := ttl.Get(v); got != 10*time.Minute {
		t.Errorf("cache_ttl = %v, want 10m (token_cache_time = 600 seconds)", got)
	}
	if src := v.Source("keystone", "cache_ttl"); !strings.Contains(src, "as [keystone_authtoken] token_cache_time") {
		t.Errorf("source %q does not name the oslo name", src)
	}
	want := []string{
		"[DEFAULT] log_date_format, use_stderr: ignored",
		"[keystone_authtoken] auth_type, memcached_servers: ignored",
		"[notifications] notification_format: ignored",
		"[oslo_messaging_rabbit] heartbeat_timeout_threshold, kombu_reconnect_delay: ignored",
	}
	if len(v.Warnings) != len(want) {
		t.Fatalf("warnings %q, want %d", v.Warnings, len(want))
	}
	for i, w := range want {
		if !strings.Contains(v.Warnings[i], w) {
			t.Errorf("warning %d = %q, want %q", i, v.Warnings[i], w)
		}
	}
}

// TestOsloNamesRefused: conflicting values under two names are refused
// with both names; equal values are not; unknown names in our own
// sections, [DEFAULT] and a section we share with oslo stay errors.
func TestOsloNamesRefused(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string // "" means no error
	}{
		{"same value under both names", "[amqp]\nssl_ca_file = /a\n[oslo_messaging_rabbit]\nssl_ca_file = /a\n", nil},
		{"equal after parsing", "[keystone]\ncache_ttl = 5m\n[keystone_authtoken]\ntoken_cache_time = 300\n", nil},
		{"conflict with our name", "[oslo_messaging_rabbit]\nssl_ca_file = /b\n[amqp]\nssl_ca_file = /a\n",
			[]string{"[oslo_messaging_rabbit] ssl_ca_file", "conflicts with [amqp] ssl_ca_file", `"/a"`}},
		{"conflict between two oslo names", "[keystone_authtoken]\ntoken_cache_time = 300\ncache_ttl_alias = 60\n",
			[]string{"[keystone_authtoken] cache_ttl_alias", "conflicts with [keystone_authtoken] token_cache_time"}},
		{"fan-out conflicts with one target", "[oslo_messaging_rabbit]\nrabbit_quorum_queue = true\n[dispatch]\nquorum_queues = false\n",
			[]string{"rabbit_quorum_queue", "conflicts with [dispatch] quorum_queues"}},
		{"bad value names the oslo name", "[keystone_authtoken]\ntoken_cache_time = -1\n",
			[]string{"[keystone] cache_ttl", "out of range", "set as [keystone_authtoken] token_cache_time"}},
		{"typo in [DEFAULT]", "[DEFAULT]\ndebg = true\n", []string{"[DEFAULT] debg", "no such option; did you mean debug?"}},
		{"typo in a section shared with oslo", "[notifications]\ntopcs = a\n", []string{"[notifications] topcs", "no such option"}},
		{"unknown section", "[oslo_messaging_kafka]\nx = 1\n", []string{"[oslo_messaging_kafka]", "no such section"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _, _, _ := osloTestSet()
			_, err := s.Load(Source{File: writeFile(t, tc.body)})
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestSampleDocumentsOsloNames: genconfig names each option's oslo names
// and what each oslo section is read for.
func TestSampleDocumentsOsloNames(t *testing.T) {
	s, _, _, _, _ := osloTestSet()
	var ini, rst strings.Builder
	if err := s.WriteSample(&ini, "t"); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteReference(&rst, "t"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Also read as (in the file): [oslo_messaging_rabbit] ssl_ca_file",
		"rabbit_quorum_queue (as [dispatch] quorum_queues)",
		"[keystone_authtoken] (keystonemiddleware's",
	} {
		if !strings.Contains(ini.String(), want) {
			t.Errorf("sample lacks %q", want)
		}
	}
	if !strings.Contains(rst.String(), `:Also read as: [keystone\_authtoken] token\_cache\_time`) {
		t.Errorf("reference lacks the aliases of cache_ttl:\n%s", rst.String())
	}
}

// TestLogFilePath: log_file and log_dir combine as oslo.log's.
func TestLogFilePath(t *testing.T) {
	for _, tc := range []struct{ file, dir, want string }{
		{"", "", ""},
		{"/var/log/a.log", "", "/var/log/a.log"},
		{"a.log", "/var/log/kolla/x", "/var/log/kolla/x/a.log"},
		{"/var/log/a.log", "/var/log/kolla/x", "/var/log/a.log"},
		{"", "/var/log/kolla/x", "/var/log/kolla/x/testd.log"},
	} {
		if got := LogFilePath("testd", tc.file, tc.dir); got != tc.want {
			t.Errorf("log_file %q log_dir %q: %q, want %q", tc.file, tc.dir, got, tc.want)
		}
	}
}
