package conf

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Broker is one RabbitMQ host of a transport URL.
type Broker struct {
	User, Password string
	Host           string // host:port
}

// TransportURL is an oslo.messaging transport URL:
//
//	rabbit://user:pass@host1:5672,user:pass@host2:5672/vhost?ssl=1
//
// Schemes rabbit and amqp are plain; rabbit+ssl, amqps or ?ssl=1 use TLS.
type TransportURL struct {
	Brokers []Broker
	VHost   string // "/" when the URL's path is empty
	TLS     bool
	Query   url.Values
}

// ParseTransportURL parses s. The error names the part that is wrong; the
// password never appears in it.
func ParseTransportURL(s string) (*TransportURL, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return nil, fmt.Errorf("transport URL must look like rabbit://user:pass@host:5672/vhost")
	}
	t := &TransportURL{}
	switch scheme {
	case "rabbit", "amqp":
	case "rabbit+ssl", "amqps":
		t.TLS = true
	default:
		return nil, fmt.Errorf("transport URL scheme %q is not supported (use rabbit, rabbit+ssl, amqp or amqps)", scheme)
	}
	rest, rawQuery, _ := strings.Cut(rest, "?")
	hosts, path, _ := strings.Cut(rest, "/")
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, fmt.Errorf("transport URL query: %v", err)
	}
	t.Query = q
	if v := q.Get("ssl"); v == "1" || strings.EqualFold(v, "true") {
		t.TLS = true
	}
	vhost, err := url.PathUnescape(path)
	if err != nil {
		return nil, fmt.Errorf("transport URL virtual host: %v", err)
	}
	if vhost == "" {
		vhost = "/"
	}
	t.VHost = vhost
	for i, h := range strings.Split(hosts, ",") {
		var b Broker
		// The last '@' ends the credentials: a password may hold one.
		if at := strings.LastIndexByte(h, '@'); at >= 0 {
			cred, hp := h[:at], h[at+1:]
			u, p, _ := strings.Cut(cred, ":")
			if u == "" && p != "" {
				return nil, fmt.Errorf("transport URL host %d: a password needs a user name", i+1)
			}
			if b.User, err = url.PathUnescape(u); err != nil {
				return nil, fmt.Errorf("transport URL host %d: bad user name escape", i+1)
			}
			if b.Password, err = url.PathUnescape(p); err != nil {
				return nil, fmt.Errorf("transport URL host %d: bad password escape", i+1)
			}
			h = hp
		}
		if h == "" {
			return nil, fmt.Errorf("transport URL host %d is empty", i+1)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			if t.TLS {
				h = net.JoinHostPort(h, "5671")
			} else {
				h = net.JoinHostPort(h, "5672")
			}
		}
		b.Host = h
		t.Brokers = append(t.Brokers, b)
	}
	// oslo lets later hosts inherit the first host's credentials.
	for i := range t.Brokers {
		if t.Brokers[i].User == "" && i > 0 {
			t.Brokers[i].User, t.Brokers[i].Password = t.Brokers[0].User, t.Brokers[0].Password
		}
	}
	return t, nil
}

// AMQPURLs returns one amqp:// or amqps:// URL per broker, in order, for
// amqp091-go's Dial.
func (t *TransportURL) AMQPURLs() []string {
	scheme := "amqp"
	if t.TLS {
		scheme = "amqps"
	}
	out := make([]string, len(t.Brokers))
	for i, b := range t.Brokers {
		u := url.URL{Scheme: scheme, Host: b.Host, Path: "/" + t.VHost, RawPath: "/" + url.PathEscape(t.VHost)}
		if b.User != "" {
			u.User = url.UserPassword(b.User, b.Password)
		}
		out[i] = u.String()
	}
	return out
}

// Redacted returns the URL with passwords replaced by "***", for logs.
func (t *TransportURL) Redacted() string {
	hosts := make([]string, len(t.Brokers))
	for i, b := range t.Brokers {
		if b.User != "" {
			hosts[i] = b.User + ":***@" + b.Host
		} else {
			hosts[i] = b.Host
		}
	}
	scheme := "rabbit"
	if t.TLS {
		scheme = "rabbit+ssl"
	}
	// ':' and '@' escaped too: nothing after the hosts reads as credentials.
	vhost := strings.NewReplacer(":", "%3A", "@", "%40").Replace(url.PathEscape(strings.TrimPrefix(t.VHost, "/")))
	return scheme + "://" + strings.Join(hosts, ",") + "/" + vhost
}
