// Package testsvc gives tests the real services they need — Postgres,
// RabbitMQ and Placement — and fails them loudly, naming the command that
// starts a service, when one cannot be reached. It never skips.
package testsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os/exec"

	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
)

const startHint = "start the local services with `make services` (tests/services.sh)"

// env returns the value of name, or def.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// PostgresAdminURL is the server tests create their databases on
// (VGPU_TEST_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432/postgres).
func PostgresAdminURL() string {
	return env("VGPU_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
}

// RabbitURL returns the AMQP URL of the test broker (VGPU_TEST_RABBIT_URL,
// default amqp://guest:guest@127.0.0.1:5672/) after checking it answers.
func RabbitURL(t testing.TB) string {
	t.Helper()
	u := env("VGPU_TEST_RABBIT_URL", "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v); %s", u, err, startHint)
	}
	conn.Close()
	return u
}

// TransportURL returns the test broker in oslo form (rabbit://…).
func TransportURL(t testing.TB) string {
	t.Helper()
	return "rabbit://" + strings.TrimPrefix(RabbitURL(t), "amqp://")
}

// PlacementURL returns the Placement endpoint (VGPU_TEST_PLACEMENT_URL,
// default http://127.0.0.1:8778) after checking it answers.
func PlacementURL(t testing.TB) string {
	t.Helper()
	u := env("VGPU_TEST_PLACEMENT_URL", "http://127.0.0.1:8778")
	req, _ := http.NewRequest(http.MethodGet, u+"/", nil)
	req.Header.Set("X-Auth-Token", "admin")
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("Placement at %s is not reachable (%v); %s", u, err, startHint)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("Placement at %s answered %s; %s", u, resp.Status, startHint)
	}
	return u
}

// Postgres creates an empty database with a unique name and returns its
// URL; the database is dropped when the test ends.
func Postgres(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := PostgresAdminURL()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("Postgres at %s is not reachable (%v); %s", admin, err, startHint)
	}
	defer conn.Close(ctx)
	name := "vgpu_test_" + randHex(6)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	return withDatabase(admin, name)
}

// MigratedPostgres is Postgres with every migration applied.
func MigratedPostgres(t testing.TB) string {
	t.Helper()
	u := Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := store.Open(ctx, store.Config{URL: u})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool, nil); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
	return u
}

// Pool opens a pool on url, closed when the test ends.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := store.Open(context.Background(), store.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func withDatabase(u, db string) string {
	base, query, _ := strings.Cut(u, "?")
	i := strings.LastIndex(base, "/")
	out := base[:i+1] + db
	if query != "" {
		out += "?" + query
	}
	return out
}

// Name returns a unique name with prefix, for queues, exchanges and
// providers a test creates.
func Name(prefix string) string { return prefix + "-" + randHex(6) }

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Must fails the test on err.
func Must(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Rabbitmqctl is the command that runs rabbitmqctl next to the test
// broker (VGPU_TEST_RABBITMQCTL, e.g. "sudo rabbitmqctl"; default
// rabbitmqctl).
func Rabbitmqctl() []string {
	if s := os.Getenv("VGPU_TEST_RABBITMQCTL"); s != "" {
		return strings.Fields(s)
	}
	return []string{"rabbitmqctl"}
}

// PrivateVHost makes a virtual host of its own on the test broker, where
// the test broker's account may do everything, deleted at the end of the
// test: for tests that need exchange vgpu without the bindings other tests
// and earlier runs left on it. It returns the vhost's amqp:// URL.
func PrivateVHost(t testing.TB) string {
	t.Helper()
	base := RabbitURL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("rabbit url: %v", err)
	}
	vhost := Name("vgpu-test")
	c := Rabbitmqctl()
	run := func(args ...string) {
		if out, err := exec.Command(c[0], append(c[1:], args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s (run the tests as root, or set VGPU_TEST_RABBITMQCTL)", strings.Join(c, " "), strings.Join(args, " "), err, out)
		}
	}
	run("add_vhost", vhost)
	t.Cleanup(func() { _ = exec.Command(c[0], append(c[1:], "delete_vhost", vhost)...).Run() })
	run("set_permissions", "-p", vhost, u.User.Username(), ".*", ".*", ".*")
	u.Path, u.RawPath = "/"+vhost, "/"+url.PathEscape(vhost)
	return u.String()
}
