package testsvc

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// AlertmanagerBinary is Debian's prometheus-alertmanager; the test fails
// with the command that installs it when it is missing.
func AlertmanagerBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus-alertmanager")
	if err != nil {
		t.Fatalf("prometheus-alertmanager is not installed (%v); run: sudo bash tests/services.sh (or apt-get install prometheus-alertmanager)", err)
	}
	return bin
}

// Alertmanager is a real Alertmanager a test runs.
type Alertmanager struct{ URL string }

// StartAlertmanager runs Alertmanager (bin) on a free loopback port with
// its own configuration and storage; it groups every alert by name, waits
// 1 s, and repeats a group every 2 s to receiver, sending resolved alerts
// too, with token as its bearer token.
func StartAlertmanager(t *testing.T, bin, receiver, token string) *Alertmanager {
	t.Helper()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	Must(t, os.WriteFile(tok, []byte(token), 0o600), "token")
	cfg := filepath.Join(dir, "alertmanager.yml")
	Must(t, os.WriteFile(cfg, []byte(`route:
  receiver: bridge
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: bridge
    webhook_configs:
      - url: `+receiver+`
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials_file: `+tok+`
`), 0o600), "config")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Must(t, err, "port")
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(dir, "alertmanager.log"))
	Must(t, err, "log")
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr,
		"--cluster.listen-address=", "--log.level=debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	Must(t, cmd.Start(), "start alertmanager")
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("alertmanager log:\n%s", LastLines(string(b), 40))
		}
	})
	am := &Alertmanager{URL: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(am.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return am
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("alertmanager not ready on %s within 30s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Post sends alerts to Alertmanager's v2 API.
func (am *Alertmanager) Post(t *testing.T, alerts []map[string]any) {
	t.Helper()
	b, _ := json.Marshal(alerts)
	resp, err := http.Post(am.URL+"/api/v2/alerts", "application/json", strings.NewReader(string(b)))
	Must(t, err, "post alerts")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("alertmanager answered %d to the alerts", resp.StatusCode)
	}
}
