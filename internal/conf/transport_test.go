package conf

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseTransportURL(t *testing.T) {
	tests := []struct {
		in       string
		wantAMQP []string
		wantTLS  bool
		wantErr  string
	}{
		{in: "rabbit://guest:guest@127.0.0.1:5672/", wantAMQP: []string{"amqp://guest:guest@127.0.0.1:5672/%2F"}},
		{in: "rabbit://u:p@h1:5672,u2:p2@h2/openstack", wantAMQP: []string{"amqp://u:p@h1:5672/openstack", "amqp://u2:p2@h2:5672/openstack"}},
		{in: "rabbit://u:p@h1,h2:5673/", wantAMQP: []string{"amqp://u:p@h1:5672/%2F", "amqp://u:p@h2:5673/%2F"}},
		{in: "rabbit://u:p%40ss@h/v?ssl=1", wantAMQP: []string{"amqps://u:p%40ss@h:5671/v"}, wantTLS: true},
		{in: "rabbit+ssl://u:p@h:5671/", wantAMQP: []string{"amqps://u:p@h:5671/%2F"}, wantTLS: true},
		{in: "kafka://h:9092/", wantErr: `scheme "kafka" is not supported`},
		{in: "h:5672", wantErr: "must look like"},
		{in: "rabbit://u:p@,h/", wantErr: "host 1 is empty"},
		{in: "rabbit://u:p@ss@h/", wantAMQP: []string{"amqp://u:p%40ss@h:5672/%2F"}}, // an unescaped '@' in the password
		{in: "rabbit://:guest@:guest@", wantErr: "a password needs a user name"},     // found by FuzzParseTransportURL
		{in: "rabbit://:secret@h/", wantErr: "a password needs a user name"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTransportURL(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.AMQPURLs(), tt.wantAMQP) {
				t.Errorf("AMQPURLs = %v, want %v", got.AMQPURLs(), tt.wantAMQP)
			}
			if got.TLS != tt.wantTLS {
				t.Errorf("TLS = %v", got.TLS)
			}
			if strings.Contains(got.Redacted(), ":p@") {
				t.Errorf("Redacted leaks: %s", got.Redacted())
			}
		})
	}
}

func FuzzParseTransportURL(f *testing.F) {
	for _, s := range []string{"rabbit://guest:guest@127.0.0.1:5672/", "rabbit://u:p@h1:5672,u2:p2@h2/openstack?ssl=1", "amqps://[::1]:5671/%2F", "rabbit://%zz@h/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseTransportURL(s)
		if err != nil {
			if strings.Contains(err.Error(), "secret") {
				t.Fatal("unexpected")
			}
			return
		}
		if len(u.AMQPURLs()) != len(u.Brokers) || len(u.Brokers) == 0 {
			t.Fatalf("brokers %d, urls %d", len(u.Brokers), len(u.AMQPURLs()))
		}
		// The credentials are in the authority; the vhost after it may hold
		// any text, ":0@" included.
		red := u.Redacted()
		authority, _, _ := strings.Cut(strings.SplitN(red, "://", 2)[1], "/")
		for _, b := range u.Brokers {
			if b.Password != "" && b.Password != "***" && strings.Contains(authority, ":"+b.Password+"@") {
				t.Fatalf("Redacted leaks the password: %s", red)
			}
		}
	})
}
