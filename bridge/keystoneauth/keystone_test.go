package keystoneauth

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
)

// keystoneStub answers a password login of the bridge (ops/s3cret) and
// token validations like Keystone: 200 with testdata/token.json for
// "good", 404 quoting the token for others, 500 for "boom".
type keystoneStub struct {
	*httptest.Server
	logins, validations atomic.Int32
	serviceToken        atomic.Value // the token the bridge must send
}

func newKeystoneStub(t *testing.T) *keystoneStub {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("testdata", "token.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := &keystoneStub{}
	s.serviceToken.Store("gAAAAAB-service-1")
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v3/auth/tokens" {
			http.NotFound(w, r)
			return
		}
		switch r.Method {
		case http.MethodPost:
			s.logins.Add(1)
			b, _ := io.ReadAll(r.Body)
			if !strings.Contains(string(b), `"s3cret"`) {
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"error":{"code":401,"title":"Unauthorized","message":"The request you have made requires authentication."}}`)
				return
			}
			w.Header().Set("X-Subject-Token", s.serviceToken.Load().(string))
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"token":{"methods":["password"],"expires_at":"2099-01-01T00:00:00.000000Z",
				"user":{"id":"u-svc","name":"ops","domain":{"id":"default","name":"Default"}},
				"project":{"id":"p-svc","name":"service","domain":{"id":"default","name":"Default"}},
				"roles":[{"id":"r9","name":"service"}],
				"catalog":[{"type":"identity","name":"keystone","endpoints":[
					{"interface":"public","region":"RegionOne","region_id":"RegionOne","url":"`+s.URL+`/v3/"}]}]}}`)
		case http.MethodGet:
			s.validations.Add(1)
			if r.Header.Get("X-Auth-Token") != s.serviceToken.Load().(string) {
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"error":{"code":401,"title":"Unauthorized","message":"The request you have made requires authentication."}}`)
				return
			}
			if _, ok := r.URL.Query()["nocatalog"]; !ok {
				t.Errorf("validation without ?nocatalog: %s", r.URL)
			}
			switch sub := r.Header.Get("X-Subject-Token"); sub {
			case "good":
				w.Header().Set("X-Subject-Token", sub)
				w.Write(doc)
			case "boom":
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, `{"error":{"code":500,"title":"Internal Server Error","message":"token boom broke us"}}`)
			default:
				w.WriteHeader(http.StatusNotFound)
				io.WriteString(w, `{"error":{"code":404,"title":"Not Found","message":"Could not find token: `+sub+`."}}`)
			}
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func cloudsYAML(t *testing.T, url, password string) clouds.ParseOption {
	t.Helper()
	path := filepath.Join(t.TempDir(), "clouds.yaml")
	y := `clouds:
  bridge:
    auth:
      auth_url: ` + url + `/v3
      username: ops
      password: ` + password + `
      project_name: service
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    interface: public
`
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return clouds.WithLocations(path)
}

func TestKeystoneValidate(t *testing.T) {
	s := newKeystoneStub(t)
	k, err := NewKeystone(KeystoneConfig{Cloud: "bridge", ParseOptions: []clouds.ParseOption{cloudsYAML(t, s.URL, "s3cret")}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s.logins.Load() != 0 {
		t.Fatal("NewKeystone logged in; it should wait for the first validation")
	}
	got, err := k.Validate(ctx, "good")
	if err != nil {
		t.Fatal(err)
	}
	want := &TokenInfo{UserID: "u-alice", UserName: "alice", UserDomain: "Default", ProjectID: "p-a", ProjectName: "project-a",
		Roles: []string{"member", "reader"}, ExpiresAt: time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}

	if _, err := k.Validate(ctx, "gAAAAAB-revoked"); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("unknown token: err = %v, want ErrInvalidToken", err)
	}
	_, err = k.Validate(ctx, "boom")
	if err == nil || errors.Is(err, ErrInvalidToken) || strings.Contains(err.Error(), "boom") || !strings.Contains(err.Error(), "500") {
		t.Errorf("5xx: err = %v, want an outage error without the token", err)
	}

	// The bridge's own token expired: gophercloud logs in again, once.
	s.serviceToken.Store("gAAAAAB-service-2")
	if _, err := k.Validate(ctx, "good"); err != nil {
		t.Fatalf("after the service token changed: %v", err)
	}
	if got := s.logins.Load(); got != 2 {
		t.Errorf("logins = %d, want 2", got)
	}
}

func TestKeystoneLoginRefused(t *testing.T) {
	s := newKeystoneStub(t)
	k, err := NewKeystone(KeystoneConfig{Cloud: "bridge", LoginRetry: time.Hour,
		ParseOptions: []clouds.ParseOption{cloudsYAML(t, s.URL, "wrong")}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, err := k.Validate(context.Background(), "good")
		if err == nil || errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), `log in as cloud "bridge"`) {
			t.Fatalf("err = %v, want a login error", err)
		}
	}
	if got := s.logins.Load(); got != 1 {
		t.Errorf("logins = %d, want 1 (a failed login is remembered for LoginRetry)", got)
	}
}

func TestNewKeystoneUnknownCloud(t *testing.T) {
	_, err := NewKeystone(KeystoneConfig{Cloud: "absent", ParseOptions: []clouds.ParseOption{cloudsYAML(t, "http://127.0.0.1:1", "x")}})
	if err == nil || !strings.Contains(err.Error(), `"absent"`) {
		t.Errorf("err = %v, want one naming the cloud", err)
	}
}
