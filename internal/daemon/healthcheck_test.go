package daemon

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testpki"
)

// TestHealthcheck: `healthcheck` asks the daemon at its configured
// listener and exits 0 only on 200; over TLS it trusts the daemon's own
// certificate and nothing else; a wildcard listener is asked on loopback.
func TestHealthcheck(t *testing.T) {
	status := http.StatusOK
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status); w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("database: down\n"))
	})
	plain := httptest.NewServer(mux)
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()
	other := httptest.NewUnstartedServer(mux) // another certificate than the one configured
	other.TLS = &tls.Config{Certificates: []tls.Certificate{testpki.NewCA(t, t.TempDir(), "other").Server("api", "127.0.0.1").TLS}}
	other.StartTLS()
	defer other.Close()

	dir := t.TempDir()
	cert := filepath.Join(dir, "api.crt")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := func(s *httptest.Server) string {
		return strings.TrimPrefix(strings.TrimPrefix(s.URL, "https://"), "http://")
	}
	_, plainPort, _ := net.SplitHostPort(addr(plain))
	closed := httptest.NewServer(mux)
	closedAddr := addr(closed)
	closed.Close()

	for _, c := range []struct {
		name   string
		probe  Probe
		args   []string
		status int
		rc     int
		out    string
	}{
		{"plain, healthy", Probe{Listen: addr(plain)}, nil, 200, ExitOK, "healthy"},
		{"wildcard listener asked on loopback", Probe{Listen: "0.0.0.0:" + plainPort}, nil, 200, ExitOK, "http://127.0.0.1:" + plainPort},
		{"unhealthy answer", Probe{Listen: addr(plain)}, nil, 500, ExitFailure, "500"},
		{"--ready asks /readyz", Probe{Listen: addr(plain)}, []string{"--ready"}, 200, ExitFailure, "database: down"},
		{"nothing listening", Probe{Listen: closedAddr}, nil, 200, ExitFailure, "unhealthy"},
		{"TLS, the daemon's own certificate", Probe{Listen: addr(tlsSrv), CertFile: cert}, nil, 200, ExitOK, "https://"},
		{"TLS, another certificate", Probe{Listen: addr(other), CertFile: cert}, nil, 200, ExitFailure, "not the configured tls_cert_file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status = c.status
			spec := testSpec()
			spec.Probe = func(*conf.Values) Probe { return c.probe }
			var stdout, stderr bytes.Buffer
			rc := Main(spec, append([]string{"healthcheck", "--config", ""}, c.args...), &stdout, &stderr)
			if rc != c.rc || !strings.Contains(stdout.String()+stderr.String(), c.out) {
				t.Errorf("rc %d, want %d; output %q, want it to hold %q", rc, c.rc, stdout.String()+stderr.String(), c.out)
			}
		})
	}
}
