// Package amqpconn connects to RabbitMQ the one way the bridge's consumers,
// its relay and the agent's transport all do, and keeps a session on the
// connection running across broker restarts.
//
// Dial tries the brokers of a transport URL in turn, with heartbeats, a
// dial timeout, TLS and a connection name that shows in RabbitMQ's
// management UI; its errors name the broker without its password. Loop
// runs a session again after it ends, with backoff that starts over once
// a session has worked for a while.
package amqpconn

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
)

// Config says how to connect.
type Config struct {
	// URLs are the brokers (one amqp:// or amqps:// URL each).
	URLs []string
	// Name is the connection's name in RabbitMQ (connection_name).
	Name string
	// Product is the client product announced (default "vgpu-bridge").
	Product string
	// TLS, when set, gives the TLS client config at each dial (so that
	// renewed certificates are picked up); nil: the library's default for
	// amqps URLs.
	TLS func() (*tls.Config, error)
	// Heartbeat is the AMQP heartbeat (default 10s).
	Heartbeat time.Duration
	// Timeout bounds the TCP and TLS dial (default 10s).
	Timeout time.Duration
}

// StaticTLS is a Config.TLS that always gives c.
func StaticTLS(c *tls.Config) func() (*tls.Config, error) {
	if c == nil {
		return nil
	}
	return func() (*tls.Config, error) { return c, nil }
}

// Dial connects to the first broker that answers, trying them all in
// order from URLs[start % len(URLs)]. It returns the connection and the
// index of its broker; the error joins each broker's, named without
// passwords.
func Dial(c Config, start int) (*amqp.Connection, int, error) {
	if len(c.URLs) == 0 {
		return nil, 0, errors.New("amqp: no broker URL")
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	props := amqp.NewConnectionProperties()
	if c.Name != "" {
		props.SetClientConnectionName(c.Name)
	}
	props["product"] = cmp.Or(c.Product, "vgpu-bridge")
	var tc *tls.Config
	if c.TLS != nil {
		var err error
		if tc, err = c.TLS(); err != nil {
			return nil, 0, fmt.Errorf("amqp tls: %w", err)
		}
	}
	var errs []error
	n := len(c.URLs)
	for i := range n {
		k := (start%n + n + i) % n
		conn, err := amqp.DialConfig(c.URLs[k], amqp.Config{Heartbeat: c.Heartbeat, TLSClientConfig: tc, Locale: "en_US",
			Properties: props, Dial: amqp.DefaultDial(c.Timeout)})
		if err == nil {
			return conn, k, nil
		}
		errs = append(errs, fmt.Errorf("connect %s: %w", Redact(c.URLs[k]), err))
	}
	return nil, 0, errors.Join(errs...)
}

// Redact returns an AMQP URL without its password, for logs.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<unparsable URL>"
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return u.Redacted()
	}
	return u.String()
}

// DefaultBackoff is the default spacing of reconnects to RabbitMQ: the
// defaults of the bridge's reconnect_min and reconnect_max options, and
// what a relay given no bounds uses.
var DefaultBackoff = backoff.Policy{Min: 500 * time.Millisecond, Max: 30 * time.Second}

// Loop keeps a session running until its context ends.
type Loop struct {
	// Backoff spaces the sessions after one ends.
	Backoff backoff.Policy
	// Healthy: a session that lasted at least this long starts the
	// backoff over (default Backoff.Max).
	Healthy time.Duration
	// Ended, when set, is told of each session that ended while the
	// context had not, with the wait before the next (logs, metrics).
	Ended func(err error, wait time.Duration)
}

// Run calls session(ctx, n) for n = 0, 1, 2 … until ctx ends, waiting
// between sessions. A session that reports progress (it delivered
// something) starts the backoff over, as does a long one. Run returns
// when ctx ends.
func (l Loop) Run(ctx context.Context, session func(ctx context.Context, n int) (progressed bool, err error)) {
	healthy := l.Healthy
	if healthy <= 0 {
		healthy = l.Backoff.Max
	}
	attempt := 0
	for n := 0; ctx.Err() == nil; n++ {
		start := time.Now()
		progressed, err := session(ctx, n)
		if ctx.Err() != nil {
			return
		}
		if progressed || time.Since(start) >= healthy {
			attempt = 0
		}
		if err == nil {
			err = errors.New("the session ended")
		}
		wait := l.Backoff.Delay(attempt)
		attempt++
		if l.Ended != nil {
			l.Ended(err, wait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
