package foundation

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestReadyzFollowsTheDispatcher: /readyz reports the broker down while
// the dispatcher has no session, although the broker itself answers
// (here its connection was cut and it waits out a long reconnect
// backoff), and ready again once it has reconnected.
func TestReadyzFollowsTheDispatcher(t *testing.T) {
	rabbit := testsvc.RabbitURL(t) // amqp://user:pass@host:port/vhost
	at := strings.LastIndex(rabbit, "@")
	hostEnd := at + 1 + strings.Index(rabbit[at+1:], "/")
	proxy := testsvc.NewProxy(t, rabbit[at+1:hostEnd])
	viaProxy := "rabbit://" + strings.TrimPrefix(rabbit[:at+1], "amqp://") + proxy.Addr() + rabbit[hostEnd:]
	d := start(t, config(t, testsvc.MigratedPostgres(t), "DEFAULT.transport_url="+viaProxy,
		"dispatch.reconnect_min=8s", "dispatch.reconnect_max=10s"))
	base := "http://" + d.API.Addr()
	checks := func() (int, map[string]string) {
		code, body := get(t, base+"/readyz", "")
		var r struct {
			Checks        map[string]string `json:"checks"`
			InvalidParams []struct {
				Name   string `json:"name"`
				Reason string `json:"reason"`
			} `json:"invalid_params"`
		}
		json.Unmarshal([]byte(body), &r) //nolint:errcheck
		if r.Checks == nil {
			r.Checks = map[string]string{}
			for _, p := range r.InvalidParams {
				r.Checks[p.Name] = p.Reason
			}
		}
		return code, r.Checks
	}
	// The broker's connections drop; new ones are let through at once.
	proxy.Cut()
	proxy.Restore(t)
	deadline := time.Now().Add(8 * time.Second)
	var code int
	var c map[string]string
	for {
		if code, c = checks(); code == http.StatusServiceUnavailable && strings.Contains(c["broker"], "dispatcher disconnected") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz %d %v while the dispatcher waits to reconnect; want 503 naming the broker's dispatcher disconnected", code, c)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitStatus(t, base+"/readyz", http.StatusOK, time.Minute)
}
