package testsvc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// PrivatePostgres is a Postgres cluster of the test's own (initdb in a
// temporary directory, on a free port, trust authentication), for tests
// that stop and start the database under the bridge. It is removed at the
// end of the test.
type PrivatePostgres struct {
	t    testing.TB
	bin  string
	data string
	as   []string // runuser -u postgres -- when root (Postgres refuses root)
	URL  string   // postgres://postgres@127.0.0.1:PORT/postgres
	port int
}

// NewPrivatePostgres makes and starts the cluster. It needs Debian's
// postgresql server binaries (VGPU_TEST_PG_BIN, default
// /usr/lib/postgresql/15/bin; make services installs them).
func NewPrivatePostgres(t testing.TB) *PrivatePostgres {
	t.Helper()
	bin := env("VGPU_TEST_PG_BIN", "/usr/lib/postgresql/15/bin")
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Fatalf("no initdb in %s (%v); %s", bin, err, startHint)
	}
	dir, err := os.MkdirTemp("", "vgpu-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &PrivatePostgres{t: t, bin: bin, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user to run a private cluster: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		p.as = []string{"runuser", "-u", "postgres", "--"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	p.run("initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync")
	p.Start()
	t.Cleanup(func() { p.pgctl("stop", "-m", "immediate") })
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	return p
}

// Start starts the cluster and waits until it takes connections.
func (p *PrivatePostgres) Start() {
	p.t.Helper()
	if err := p.pgctl("start", "-w", "-l", filepath.Join(filepath.Dir(p.data), "server.log"),
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", p.port, filepath.Dir(p.data))); err != nil {
		p.t.Fatalf("start the private Postgres: %v", err)
	}
}

// Stop stops the cluster (fast: open sessions are ended).
func (p *PrivatePostgres) Stop() {
	p.t.Helper()
	if err := p.pgctl("stop", "-w", "-m", "fast"); err != nil {
		p.t.Fatalf("stop the private Postgres: %v", err)
	}
}

func (p *PrivatePostgres) pgctl(args ...string) error {
	cmd := p.command("pg_ctl", append([]string{"-D", p.data}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %v: %v\n%s", args, err, out)
	}
	return nil
}

func (p *PrivatePostgres) run(name string, args ...string) {
	p.t.Helper()
	if out, err := p.command(name, args...).CombinedOutput(); err != nil {
		p.t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func (p *PrivatePostgres) command(name string, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), p.as...), filepath.Join(p.bin, name)), args...)
	return exec.Command(argv[0], argv[1:]...)
}
