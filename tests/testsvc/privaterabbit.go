package testsvc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PrivateRabbit is a RabbitMQ node of the test's own (its own node name,
// port, database and logs, no plugins), for tests that stop and start the
// broker under the bridge. It is stopped and removed at the end of the
// test.
type PrivateRabbit struct {
	t    testing.TB
	dir  string
	node string
	env  []string
	cmd  *exec.Cmd
	URL  string // amqp://guest:guest@127.0.0.1:PORT/
}

// NewPrivateRabbit makes and starts the node (about 10 s). It needs
// Debian's rabbitmq-server (VGPU_TEST_RABBITMQ_SERVER, default
// /usr/lib/rabbitmq/bin/rabbitmq-server; make services installs it) and
// the right to run it (root, as for make services).
func NewPrivateRabbit(t testing.TB) *PrivateRabbit {
	t.Helper()
	server := env("VGPU_TEST_RABBITMQ_SERVER", "/usr/lib/rabbitmq/bin/rabbitmq-server")
	if _, err := os.Stat(server); err != nil {
		t.Fatalf("no %s (%v); %s", server, err, startHint)
	}
	dir, err := os.MkdirTemp("", "vgpu-rabbit-")
	if err != nil {
		t.Fatal(err)
	}
	port, dist := freePort(t), freePort(t)
	name := strings.ReplaceAll(Name("vgputest"), "-", "")
	p := &PrivateRabbit{t: t, dir: dir, node: name + "@localhost", URL: fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port)}
	conf := filepath.Join(dir, "rabbitmq.conf")
	plugins := filepath.Join(dir, "enabled_plugins")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\n", port)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plugins, []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.env = append(os.Environ(), "RABBITMQ_NODENAME="+p.node, fmt.Sprintf("RABBITMQ_DIST_PORT=%d", dist), "RABBITMQ_CONFIG_FILE="+conf,
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+plugins, "RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"))
	p.Start()
	t.Cleanup(func() {
		if p.cmd != nil {
			// The group: rabbitmq-server is a script whose Erlang VM is
			// its child; killing the script alone left the VM running
			// (its node name is in its environment, not its command
			// line, so pkill -f did not find it either).
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
			p.cmd.Wait()                                      //nolint:errcheck
		}
		os.RemoveAll(dir)
	})
	return p
}

// Start starts the node and waits until it takes connections.
func (p *PrivateRabbit) Start() {
	p.t.Helper()
	log, err := os.OpenFile(filepath.Join(p.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(env("VGPU_TEST_RABBITMQ_SERVER", "/usr/lib/rabbitmq/bin/rabbitmq-server"))
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = p.env, p.dir, log, log
	// A process group of its own, killed whole at cleanup; and the script
	// dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start the private RabbitMQ: %v", err)
	}
	log.Close()
	p.cmd = cmd
	addr := strings.TrimSuffix(strings.TrimPrefix(p.URL, "amqp://guest:guest@"), "/")
	deadline := time.Now().Add(90 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(p.dir, "server.out"))
			p.t.Fatalf("the private RabbitMQ did not listen within 90 s:\n%s", LastLines(string(b), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Stop stops the node as systemd does (SIGTERM: RabbitMQ shuts down
// cleanly, closing its connections) and waits for it to exit.
func (p *PrivateRabbit) Stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("stop the private RabbitMQ: %v", err)
	}
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }() //nolint:errcheck
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		p.t.Fatal("the private RabbitMQ did not stop within 60 s")
	}
	p.cmd = nil
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
