// Package pgtls runs the bridge against a private Postgres cluster with
// ssl = on and a server certificate from a CA made in the test, and
// shows that [database] connection with sslmode=verify-full works with
// that CA and is refused, with a clear error, with another CA, with a
// host name the certificate does not carry, or without TLS. The cluster
// is Debian's PostgreSQL (initdb, pg_ctl) in a temporary directory on a
// free port, run as the postgres user when the test runs as root; the
// machine's own cluster is never touched.
package pgtls

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testpki"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// password of the cluster's postgres role (scram-sha-256 over TLS only).
const password = "pgtls-Secret-4b1d9c"

// quickStop: a stopping bridge waits a commit timeout (2/3 of the webhook
// write_timeout) for webhooks still draining; these tests send none.
const quickStop = "webhooks.write_timeout=1s"

// cluster is a private Postgres server.
type cluster struct {
	dir, data string
	port      int
	ca        *testpki.CA
}

// pgBin finds Debian's server binaries (the newest installed major).
func pgBin(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(dirs) == 0 {
		t.Fatal("no /usr/lib/postgresql/*/bin/initdb: install Debian's postgresql package (apt-get install postgresql), " +
			"which `make services` (tests/services.sh) uses")
	}
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[j]))))
		return vi < vj
	})
	return filepath.Dir(dirs[len(dirs)-1])
}

// run runs a server binary, as postgres when the test runs as root
// (initdb and postgres refuse root).
func run(t *testing.T, args ...string) {
	t.Helper()
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// chown gives paths to the postgres user when running as root.
func chown(t *testing.T, paths ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	u, err := user.Lookup("postgres")
	testsvc.Must(t, err, "user postgres")
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for _, p := range paths {
		testsvc.Must(t, os.Chown(p, uid, gid), "chown "+p)
	}
}

// startCluster initialises and starts a cluster listening on 127.0.0.1
// and 127.0.0.2 with TLS (certificate for localhost and 127.0.0.1 only)
// and a pg_hba.conf that admits TLS connections with a password and
// rejects the others. It is stopped and removed when the test ends.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	bin := pgBin(t)
	dir, err := os.MkdirTemp("", "vgpu-pgtls-")
	testsvc.Must(t, err, "temp dir")
	c := &cluster{dir: dir, data: filepath.Join(dir, "data"), port: testsvc.FreePort(t)}
	t.Cleanup(func() { os.RemoveAll(dir) })
	chown(t, dir)
	c.ca = testpki.NewCA(t, dir, "pgtls-ca")
	srv := c.ca.Server("server", "localhost", "127.0.0.1")
	pw := filepath.Join(dir, "pwfile")
	testsvc.Must(t, os.WriteFile(pw, []byte(password+"\n"), 0o600), "password file")
	chown(t, srv.CertFile, srv.KeyFile, pw)

	run(t, filepath.Join(bin, "initdb"), "-D", c.data, "-U", "postgres", "-E", "UTF8", "--no-sync",
		"--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile="+pw)
	hba := "local all all trust\n" +
		"hostssl all all 127.0.0.0/8 scram-sha-256\n" +
		"hostnossl all all 127.0.0.0/8 reject\n"
	hbaFile := filepath.Join(c.data, "pg_hba.conf")
	testsvc.Must(t, os.WriteFile(hbaFile, []byte(hba), 0o600), "pg_hba.conf")
	chown(t, hbaFile)
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1,127.0.0.2 -c ssl=on -c ssl_cert_file=%s -c ssl_key_file=%s "+
		"-c ssl_min_protocol_version=TLSv1.2 -c fsync=off -c full_page_writes=off -c max_connections=60",
		c.port, dir, srv.CertFile, srv.KeyFile)
	run(t, filepath.Join(bin, "pg_ctl"), "-D", c.data, "-o", opts, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start")
	t.Cleanup(func() {
		cmd := []string{filepath.Join(bin, "pg_ctl"), "-D", c.data, "-m", "immediate", "-w", "stop"}
		if os.Geteuid() == 0 {
			cmd = append([]string{"runuser", "-u", "postgres", "--"}, cmd...)
		}
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Logf("stop private cluster: %v\n%s", err, out)
		}
	})
	return c
}

// url is the bridge's [database] connection to host with query.
func (c *cluster) url(host, query string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password),
		Host: fmt.Sprintf("%s:%d", host, c.port), Path: "/postgres", RawQuery: query}
	return u.String()
}

// runBridge runs bridge.Run on dbURL and returns its error; when it has
// started (database connected and migrated, API listening), started is
// called with it and the bridge is stopped.
func runBridge(t *testing.T, dbURL string, started func(*bridge.Daemon)) error {
	t.Helper()
	v := testbridge.Config(t, dbURL, quickStop)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ran := false
	err := bridge.Run(ctx, v, nil, func(d *bridge.Daemon) {
		ran = true
		if started != nil {
			started(d)
		}
		cancel()
	})
	if ran && (err == nil || errors.Is(err, context.Canceled)) {
		return nil // started, then stopped cleanly
	}
	if err == nil {
		err = errors.New("bridge.Run returned without an error before it started")
	}
	return err
}

func TestVerifyFull(t *testing.T) {
	c := startCluster(t)
	dir := t.TempDir()
	other := testpki.NewCA(t, dir, "other-ca")

	t.Run("verify-full with the CA", func(t *testing.T) {
		// bridge.Run connects, migrates the database and starts.
		var ssl bool
		var version string
		var migrations int
		err := runBridge(t, c.url("127.0.0.1", "sslmode=verify-full&sslrootcert="+c.ca.File), func(d *bridge.Daemon) {
			// Its connections are TLS, and the schema is there.
			ctx := context.Background()
			testsvc.Must(t, d.Pool.QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version), "pg_stat_ssl")
			testsvc.Must(t, d.Pool.QueryRow(ctx, `SELECT count(*) FROM goose_db_version WHERE is_applied AND version_id > 0`).Scan(&migrations), "migrations")
		})
		if err != nil {
			t.Fatalf("bridge.Run with verify-full: %v", err)
		}
		if !ssl || (version != "TLSv1.3" && version != "TLSv1.2") || migrations == 0 {
			t.Errorf("bridge connection: ssl %v, version %q, %d migrations applied; want TLS and the schema", ssl, version, migrations)
		}
	})
	t.Run("verify-full by name", func(t *testing.T) {
		// The bridge's connect and migrations path (what `vgpu-bridge
		// migrate up` and serve do first), by host name.
		v := testbridge.Config(t, c.url("localhost", "sslmode=verify-full&sslrootcert="+c.ca.File), quickStop)
		sc, err := bridge.StoreConfig(v)
		testsvc.Must(t, err, "store config")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool, err := store.Open(ctx, sc)
		testsvc.Must(t, err, "open")
		defer pool.Close()
		if _, err := store.Migrate(ctx, pool, nil); err != nil {
			t.Fatalf("migrate over TLS by name: %v", err)
		}
		var ssl bool
		testsvc.Must(t, pool.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl), "pg_stat_ssl")
		if !ssl {
			t.Error("connection by name is not TLS")
		}
	})

	refusals := []struct {
		name, host, query string
		want              string
	}{
		{"another CA", "127.0.0.1", "sslmode=verify-full&sslrootcert=" + other.File, "certificate signed by unknown authority"},
		{"host name not in the certificate", "127.0.0.2", "sslmode=verify-full&sslrootcert=" + c.ca.File, "certificate is valid for"},
		{"no TLS", "127.0.0.1", "sslmode=disable", "no encryption"},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			err := runBridge(t, c.url(r.host, r.query), nil)
			if err == nil {
				t.Fatal("the bridge started; want it refused")
			}
			if !strings.Contains(err.Error(), r.want) {
				t.Errorf("error %q does not say %q", err, r.want)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("the error shows the database password: %q", err)
			}
		})
	}
}
