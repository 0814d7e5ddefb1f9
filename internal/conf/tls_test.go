package conf

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClientTLSErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	key := filepath.Join(dir, "open.key")
	_ = os.WriteFile(empty, []byte("no certificates here\n"), 0o644)
	_ = os.WriteFile(key, []byte("x"), 0o644)
	_ = os.Chmod(key, 0o644)
	for name, tc := range map[string]struct {
		f    TLSFiles
		want string
	}{
		"missing CA file":     {TLSFiles{CAFile: filepath.Join(dir, "nope.pem")}, "CA file"},
		"CA file without PEM": {TLSFiles{CAFile: empty}, "no PEM certificate"},
		"cert without key":    {TLSFiles{CertFile: empty}, "go together"},
		"key without cert":    {TLSFiles{KeyFile: key}, "go together"},
		"world-readable key":  {TLSFiles{CertFile: empty, KeyFile: key}, "chmod"},
	} {
		if _, err := ClientTLS(tc.f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	c, err := ClientTLS(TLSFiles{ServerName: "rabbit.example.org"})
	if err != nil || c.MinVersion != tls.VersionTLS12 || c.ServerName != "rabbit.example.org" || c.InsecureSkipVerify || c.RootCAs != nil {
		t.Errorf("defaults: %+v %v", c, err)
	}
}
