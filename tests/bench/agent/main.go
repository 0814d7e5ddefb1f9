// Command agent is the load harness of vgpu-agent's command loop (`make
// bench`). One command at a time, it measures the round trip bridge →
// RabbitMQ → agent → RabbitMQ → bridge, in one run:
//
//	(a) baseline: a bare amqp091 responder on the same broker that consumes
//	    with manual ack, publishes a reply with publisher confirms, then
//	    acks — the agent's transport pattern with nothing executed;
//	(b) the agent on a fake host (vgpu-agent serve --fake-host, in process):
//	    verify_vgpu (reads libvirt and sysfs, journals the result), and
//	    create_mdev / remove_mdev pairs (write the fake sysfs, fsync the
//	    journal per step).
//
// It prints p50 and p99 of each (medians over -runs) and the ratio of the
// agent's p50 to the baseline's.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
)

var (
	flagN      = flag.Int("n", 300, "round trips per measurement")
	flagRuns   = flag.Int("runs", 3, "measurements of each kind; medians are printed")
	flagRabbit = flag.String("rabbit", envOr("VGPU_TEST_RABBIT_URL", "amqp://guest:guest@127.0.0.1:5672/"), "AMQP URL")
)

const (
	runningVM = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01" // fake host's default spec
	novaMdev  = "4b20d080-1b54-4048-85b3-a6a62d165c01"
	freeGPU   = "0000:d8:00.0"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench agent:", err)
		os.Exit(1)
	}
}

type stats struct{ p50, p99 time.Duration }

func percentiles(d []time.Duration) stats {
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return stats{at(0.50), at(0.99)}
}

func median(xs []time.Duration) time.Duration {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// client is the bridge side: it publishes commands and waits for results.
type client struct {
	ch      *amqp.Channel
	key     string
	results <-chan amqp.Delivery
}

func newClient(conn *amqp.Connection, exchange, cmdKey, resultKey string) (*client, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return nil, err
	}
	if err := ch.QueueBind(q.Name, resultKey, exchange, false, nil); err != nil {
		return nil, err
	}
	d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return nil, err
	}
	return &client{ch: ch, key: cmdKey, results: d}, nil
}

// roundTrip sends body with id and waits for the result naming id.
func (c *client) roundTrip(exchange, id string, body []byte) (time.Duration, error) {
	start := time.Now()
	if err := c.ch.PublishWithContext(context.Background(), exchange, c.key, false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: body}); err != nil {
		return 0, err
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case d := <-c.results:
			if d.MessageId == id {
				return time.Since(start), nil
			}
		case <-timeout:
			return 0, fmt.Errorf("no answer to %s", id)
		}
	}
}

// baseline runs a bare responder and measures n round trips.
func baseline(conn *amqp.Connection, n int, tag string) ([]time.Duration, error) {
	const exchange = "vgpu-bench"
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil); err != nil {
		return nil, err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return nil, err
	}
	if err := ch.QueueBind(q.Name, "cmd."+tag, exchange, false, nil); err != nil {
		return nil, err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return nil, err
	}
	pub, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	if err := pub.Confirm(false); err != nil {
		return nil, err
	}
	in, err := ch.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		return nil, err
	}
	go func() {
		for d := range in {
			dc, err := pub.PublishWithDeferredConfirmWithContext(context.Background(), exchange, "res."+tag, false, false,
				amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Body: d.Body})
			if err == nil {
				dc.Wait()
			}
			d.Ack(false)
		}
	}()
	c, err := newClient(conn, exchange, "cmd."+tag, "res."+tag)
	if err != nil {
		return nil, err
	}
	defer c.ch.Close()
	body, _ := json.Marshal(protocol.Command{V: 1, ID: "x", Kind: protocol.VerifyVGPU, Host: tag})
	out := make([]time.Duration, 0, n)
	for i := range n {
		d, err := c.roundTrip(exchange, fmt.Sprintf("%s-%d", tag, i), body)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// agentRun starts an agent on a fake host and measures n round trips of
// verify_vgpu and n/2 create+remove pairs.
func agentRun(conn *amqp.Connection, n int, tag string) (verify, mutate []time.Duration, err error) {
	dir, err := os.MkdirTemp("", "vgpu-bench-agent-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	if _, err := fakehost.Build(filepath.Join(dir, "host"), fakehost.DefaultSpec()); err != nil {
		return nil, nil, err
	}
	host := "bench-" + tag
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		ch.QueueDelete(protocol.AgentQueue(host), false, false, false)
		ch.Close()
	}()
	if err := transport.Declare(ch, host); err != nil {
		return nil, nil, err
	}
	c, err := newClient(conn, protocol.Exchange, protocol.CommandRoutingKey(host), protocol.ResultRoutingKey(host))
	if err != nil {
		return nil, nil, err
	}
	defer c.ch.Close()
	// Signed commands, results and reports, as by default.
	keys, err := testkeys.New(dir)
	if err != nil {
		return nil, nil, err
	}
	sec, err := keys.Enrol(host)
	if err != nil {
		return nil, nil, err
	}
	v, err := agent.LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.host=" + host,
		"DEFAULT.transport_url=rabbit://" + (*flagRabbit)[len("amqp://"):], "DEFAULT.state_path=" + filepath.Join(dir, "state"),
		"DEFAULT.listen=127.0.0.1:0"}, sec...)})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.RunWith(ctx, v, slog.New(slog.DiscardHandler), agent.RunOptions{FakeHostDir: filepath.Join(dir, "host")})
	}()
	defer func() { cancel(); <-done }()

	send := func(id string, k protocol.Kind, inst string, params any) (time.Duration, error) {
		cmd := protocol.Command{V: 1, ID: id, Kind: k, Host: host, InstanceUUID: inst, IssuedAt: time.Now().UTC(),
			ExpiresAt: time.Now().UTC().Add(time.Minute)}
		cmd.MarshalParams(params)
		if err := keys.Signer().SignCommand(&cmd); err != nil {
			return 0, err
		}
		body, _ := json.Marshal(cmd)
		return c.roundTrip(protocol.Exchange, id, body)
	}
	// Warm up (the first command waits for the agent to connect).
	if _, err := send(tag+"-warm", protocol.VerifyVGPU, runningVM, protocol.VerifyParams{MdevUUID: novaMdev}); err != nil {
		return nil, nil, err
	}
	for i := range n {
		d, err := send(fmt.Sprintf("%s-v%d", tag, i), protocol.VerifyVGPU, runningVM, protocol.VerifyParams{MdevUUID: novaMdev})
		if err != nil {
			return nil, nil, err
		}
		verify = append(verify, d)
	}
	for i := range n / 2 {
		uuid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		d1, err := send(fmt.Sprintf("%s-c%d", tag, i), protocol.CreateMdev, "",
			protocol.MdevParams{MdevUUID: uuid, ParentPCI: freeGPU, TypeID: "nvidia-232"})
		if err != nil {
			return nil, nil, err
		}
		d2, err := send(fmt.Sprintf("%s-r%d", tag, i), protocol.RemoveMdev, "", protocol.MdevParams{MdevUUID: uuid})
		if err != nil {
			return nil, nil, err
		}
		mutate = append(mutate, d1, d2)
	}
	return verify, mutate, nil
}

func run() error {
	conn, err := amqp.Dial(*flagRabbit)
	if err != nil {
		return fmt.Errorf("RabbitMQ at %s: %w (start it with `make services`)", *flagRabbit, err)
	}
	defer conn.Close()
	var b50, b99, v50, v99, m50, m99 []time.Duration
	for r := range *flagRuns {
		tag := fmt.Sprintf("%d-%d", os.Getpid(), r)
		base, err := baseline(conn, *flagN, tag)
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		verify, mutate, err := agentRun(conn, *flagN, tag)
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		bs, vs, ms := percentiles(base), percentiles(verify), percentiles(mutate)
		fmt.Printf("run %d: baseline p50 %v p99 %v | verify_vgpu p50 %v p99 %v | create/remove_mdev p50 %v p99 %v\n",
			r+1, bs.p50, bs.p99, vs.p50, vs.p99, ms.p50, ms.p99)
		b50, b99 = append(b50, bs.p50), append(b99, bs.p99)
		v50, v99 = append(v50, vs.p50), append(v99, vs.p99)
		m50, m99 = append(m50, ms.p50), append(m99, ms.p99)
	}
	bp50, vp50, mp50 := median(b50), median(v50), median(m50)
	fmt.Printf("agent command round trip through RabbitMQ (fake host, %d per run, medians of %d runs):\n", *flagN, *flagRuns)
	fmt.Printf("  baseline (bare consume→publish+confirm→ack)  p50 %8v  p99 %8v\n", bp50, median(b99))
	fmt.Printf("  verify_vgpu                                   p50 %8v  p99 %8v  ratio p50 %.2fx baseline\n",
		vp50, median(v99), float64(vp50)/float64(bp50))
	fmt.Printf("  create_mdev / remove_mdev                     p50 %8v  p99 %8v  ratio p50 %.2fx baseline\n",
		mp50, median(m99), float64(mp50)/float64(bp50))
	return nil
}
