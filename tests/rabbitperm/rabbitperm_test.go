// Package rabbitperm_test creates the accounts of etc/rabbitmq/setup-accounts.sh
// on the real RabbitMQ, in a virtual host of its own, and shows what each
// may and may not do: an agent reads only its own queue and speaks only for
// its host; the bridge publishes commands and reads results and reports but
// cannot forge a result; Nova's account cannot touch vgpu-bridge's names.
//
// It needs rabbitmqctl (as root, or VGPU_TEST_RABBITMQCTL, e.g.
// "sudo rabbitmqctl") next to the broker of testsvc.RabbitURL.
package rabbitperm_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

func rabbitmqctl() []string { return testsvc.Rabbitmqctl() }

func ctl(t *testing.T, args ...string) {
	t.Helper()
	c := rabbitmqctl()
	out, err := exec.Command(c[0], append(c[1:], args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", strings.Join(c, " "), strings.Join(args, " "), err, out)
	}
}

// env is a private vhost with the accounts of the script.
type env struct {
	t     *testing.T
	vhost string
	base  string // amqp://127.0.0.1:5672 of the test broker
}

func newEnv(t *testing.T) *env {
	t.Helper()
	u, err := url.Parse(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "rabbit url")
	e := &env{t: t, vhost: testsvc.Name("vgpu-test"), base: "amqp://" + u.Host}
	ctl(t, "add_vhost", e.vhost)
	t.Cleanup(func() {
		c := rabbitmqctl()
		_ = exec.Command(c[0], append(c[1:], "delete_vhost", e.vhost)...).Run()
	})
	return e
}

// account runs the script for one account and returns a connection as it.
func (e *env) account(kind, user string, extra ...string) *amqp.Connection {
	e.t.Helper()
	pw := testsvc.Name("pw")
	pwFile := filepath.Join(e.t.TempDir(), "pw")
	testsvc.Must(e.t, os.WriteFile(pwFile, []byte(pw+"\n"), 0o600), "password file")
	c := rabbitmqctl()
	script, _ := filepath.Abs("../../etc/rabbitmq/setup-accounts.sh")
	cmd := exec.Command(script, append([]string{"-p", e.vhost, "-P", pwFile, kind, user}, extra...)...)
	cmd.Env = append(os.Environ(), "RABBITMQCTL="+strings.Join(c, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("setup-accounts.sh %s %s: %v\n%s", kind, user, err, out)
	}
	if strings.Contains(string(out), pw) {
		e.t.Errorf("setup-accounts.sh printed the password:\n%s", out)
	}
	e.t.Cleanup(func() { _ = exec.Command(c[0], append(c[1:], "delete_user", user)...).Run() })
	u := e.base + "/" + url.PathEscape(e.vhost)
	conn, err := amqp.DialConfig(strings.Replace(u, "amqp://", "amqp://"+user+":"+pw+"@", 1),
		amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	testsvc.Must(e.t, err, "connect as "+user)
	e.t.Cleanup(func() { conn.Close() })
	return conn
}

// do runs fn on a fresh channel and returns its error, or the channel's
// closing error when the broker refused something asynchronously.
func do(conn *amqp.Connection, fn func(ch *amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := fn(ch); err != nil {
		return err
	}
	// A round trip (basic.qos) makes any refusal of what fn sent arrive.
	qerr := ch.Qos(1, 0, false)
	select {
	case e := <-closed:
		if e != nil {
			return e
		}
	default:
	}
	return qerr
}

// publish publishes on the vgpu exchange with confirms and reports the
// broker's verdict.
func publish(conn *amqp.Connection, exchange, key string) error {
	return do(conn, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, false, false,
			amqp.Publishing{Body: []byte(`{"v":1}`)})
		if err != nil {
			return err
		}
		select {
		case <-dc.Done():
			if dc.Acked() {
				return nil
			}
			select {
			case e := <-closed:
				if e != nil {
					return e
				}
			case <-time.After(time.Second):
			}
			return errors.New("nacked")
		case e := <-closed:
			return e
		case <-time.After(10 * time.Second):
			return errors.New("no confirm")
		}
	})
}

func consume(conn *amqp.Connection, queue string) error {
	return do(conn, func(ch *amqp.Channel) error {
		_, err := ch.Consume(queue, "", false, false, false, false, nil)
		return err
	})
}

func get(t *testing.T, conn *amqp.Connection, queue string) string {
	t.Helper()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	defer ch.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, ok, err := ch.Get(queue, true)
		testsvc.Must(t, err, "get "+queue)
		if ok {
			return d.RoutingKey
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing on %s", queue)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func refused(t *testing.T, what string, err error) {
	t.Helper()
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
		t.Errorf("%s: got %v, want ACCESS_REFUSED", what, err)
	}
}

func allowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

func TestAccounts(t *testing.T) {
	e := newEnv(t)
	prefix := testsvc.Name("vgpu-test")
	hostA, hostB := "compute-a.example.org", "compute-b.example.org"
	bridge := e.account("bridge", prefix+"-bridge")
	agentA := e.account("agent", prefix+"-agent-a", hostA)
	agentB := e.account("agent", prefix+"-agent-b", hostB)
	nova := e.account("nova", prefix+"-nova")

	// Before the bridge declared the exchange, an agent cannot.
	refused(t, "agent declares the exchange", transport.EnsureExchange(agentA))

	// The bridge's topology: the exchange, its queues, Nova's exchange
	// (Nova's account declares it as oslo.messaging does).
	allowed(t, "nova declares its exchange", do(nova, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare("nova", "topic", false, false, false, false, nil)
	}))
	allowed(t, "bridge declares its topology", do(bridge, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(protocol.Exchange, "topic", true, false, false, false, nil); err != nil {
			return err
		}
		for q, key := range map[string]string{protocol.ResultsQueue: protocol.ResultsBind, protocol.ReportsQueue: protocol.ReportsBind} {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				return err
			}
			if err := ch.QueueBind(q, key, protocol.Exchange, false, nil); err != nil {
				return err
			}
		}
		if _, err := ch.QueueDeclare("vgpu-bridge.notifications", true, false, false, false, nil); err != nil {
			return err
		}
		for _, key := range []string{"versioned_notifications.info", "versioned_notifications.error"} {
			if err := ch.QueueBind("vgpu-bridge.notifications", key, "nova", false, nil); err != nil {
				return err
			}
		}
		return nil
	}))
	// The bridge may pre-declare an agent's queue (commands are then kept
	// until the agent first starts).
	allowed(t, "bridge declares agent B's queue", do(bridge, func(ch *amqp.Channel) error { return transport.DeclareQueue(ch, hostB) }))

	// Each agent sets up exactly as vgpu-agent does.
	for host, conn := range map[string]*amqp.Connection{hostA: agentA, hostB: agentB} {
		allowed(t, "agent "+host+" sets up", do(conn, func(ch *amqp.Channel) error {
			if err := transport.EnsureExchange(conn); err != nil {
				return err
			}
			return transport.DeclareQueue(ch, host)
		}))
	}

	// Agent A: its own queue and its own results and reports.
	allowed(t, "agent A consumes its queue", consume(agentA, protocol.AgentQueue(hostA)))
	allowed(t, "agent A publishes its result", publish(agentA, protocol.Exchange, protocol.ResultRoutingKey(hostA)))
	allowed(t, "agent A publishes its report", publish(agentA, protocol.Exchange, protocol.ReportRoutingKey(hostA)))
	if k := get(t, bridge, protocol.ResultsQueue); k != protocol.ResultRoutingKey(hostA) {
		t.Errorf("bridge read result %q", k)
	}
	if k := get(t, bridge, protocol.ReportsQueue); k != protocol.ReportRoutingKey(hostA) {
		t.Errorf("bridge read report %q", k)
	}

	// …and nothing else.
	refused(t, "agent A consumes B's queue", consume(agentA, protocol.AgentQueue(hostB)))
	refused(t, "agent A gets from B's queue", do(agentA, func(ch *amqp.Channel) error {
		_, _, err := ch.Get(protocol.AgentQueue(hostB), false)
		return err
	}))
	refused(t, "agent A purges B's queue", do(agentA, func(ch *amqp.Channel) error {
		_, err := ch.QueuePurge(protocol.AgentQueue(hostB), false)
		return err
	}))
	refused(t, "agent A declares B's queue", do(agentA, func(ch *amqp.Channel) error { return transport.DeclareQueue(ch, hostB) }))
	refused(t, "agent A binds its queue to B's commands", do(agentA, func(ch *amqp.Channel) error {
		return ch.QueueBind(protocol.AgentQueue(hostA), protocol.CommandRoutingKey(hostB), protocol.Exchange, false, nil)
	}))
	refused(t, "agent A binds its queue to all results", do(agentA, func(ch *amqp.Channel) error {
		return ch.QueueBind(protocol.AgentQueue(hostA), protocol.ResultsBind, protocol.Exchange, false, nil)
	}))
	refused(t, "agent A consumes the results", consume(agentA, protocol.ResultsQueue))
	refused(t, "agent A publishes a command for B", publish(agentA, protocol.Exchange, protocol.CommandRoutingKey(hostB)))
	refused(t, "agent A publishes a command for itself", publish(agentA, protocol.Exchange, protocol.CommandRoutingKey(hostA)))
	refused(t, "agent A publishes B's result", publish(agentA, protocol.Exchange, protocol.ResultRoutingKey(hostB)))
	refused(t, "agent A publishes B's report", publish(agentA, protocol.Exchange, protocol.ReportRoutingKey(hostB)))
	refused(t, "agent A publishes into B's queue by the default exchange", publish(agentA, "", protocol.AgentQueue(hostB)))
	refused(t, "agent A publishes on Nova's exchange", publish(agentA, "nova", "versioned_notifications.info"))
	refused(t, "agent A deletes the exchange", do(agentA, func(ch *amqp.Channel) error {
		return ch.ExchangeDelete(protocol.Exchange, false, false)
	}))
	// A host name is matched literally: the dots of compute-a.example.org
	// are not wildcards.
	refused(t, "agent A publishes for a look-alike host", publish(agentA, protocol.Exchange, "result.compute-aXexample.org"))

	// The bridge commands agents, and the command reaches B's queue.
	allowed(t, "bridge publishes a command for B", publish(bridge, protocol.Exchange, protocol.CommandRoutingKey(hostB)))
	if k := get(t, agentB, protocol.AgentQueue(hostB)); k != protocol.CommandRoutingKey(hostB) {
		t.Errorf("agent B read %q", k)
	}
	refused(t, "bridge publishes a result", publish(bridge, protocol.Exchange, protocol.ResultRoutingKey(hostA)))
	refused(t, "bridge publishes a report", publish(bridge, protocol.Exchange, protocol.ReportRoutingKey(hostA)))
	refused(t, "bridge consumes an agent's queue", consume(bridge, protocol.AgentQueue(hostA)))
	refused(t, "bridge publishes on Nova's exchange", publish(bridge, "nova", "versioned_notifications.info"))
	refused(t, "bridge binds to Nova's RPC topics", do(bridge, func(ch *amqp.Channel) error {
		return ch.QueueBind("vgpu-bridge.notifications", "compute.#", "nova", false, nil)
	}))

	// Nova's account: its own exchange, not vgpu-bridge's names.
	allowed(t, "nova publishes a notification", publish(nova, "nova", "versioned_notifications.info"))
	if k := get(t, bridge, "vgpu-bridge.notifications"); k != "versioned_notifications.info" {
		t.Errorf("bridge read notification %q", k)
	}
	refused(t, "nova publishes a command", publish(nova, protocol.Exchange, protocol.CommandRoutingKey(hostA)))
	refused(t, "nova consumes an agent's queue", consume(nova, protocol.AgentQueue(hostA)))
	refused(t, "nova consumes the bridge's notifications", consume(nova, "vgpu-bridge.notifications"))
}
