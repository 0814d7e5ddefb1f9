// Package computeapitest answers GET /servers/{id} as nova-api does, for
// tests of the bridge's on-demand lookup of servers. Its body is Nova's
// own API sample (server-get-resp.json.tpl, copied from Nova 26's
// nova/tests/functional/api_sample_tests/api_samples/servers/v2.73/, the
// template Nova's functional tests check
// nova.api.openstack.compute.servers.ServersController.show against), with
// its placeholders filled in.
package computeapitest

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

//go:embed server-get-resp.json.tpl
var serverGetTemplate string

// Server is what a test sets of a server; the rest is the sample's.
type Server struct {
	ID, TenantID string
	Host, Node   string // compute host and hypervisor hostname (Node: Host when empty)
	Updated      time.Time
}

var placeholder = regexp.MustCompile(`%\((\w+)\)s`)

// ServerGetResponse is Nova's GET /servers/{id} answer for s.
func ServerGetResponse(s Server) []byte {
	at := s.Updated.UTC().Format(time.RFC3339)
	body := placeholder.ReplaceAllStringFunc(serverGetTemplate, func(m string) string {
		switch placeholder.FindStringSubmatch(m)[1] {
		case "id", "uuid":
			return s.ID
		case "isotime":
			return at
		case "strtime":
			return s.Updated.UTC().Format("2006-01-02T15:04:05.000000")
		case "reservation_id":
			return "r-3fhpjulh"
		default: // endpoints
			return "http://openstack.example.com"
		}
	})
	var doc map[string]map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		panic(fmt.Sprintf("computeapitest: Nova's sample does not parse: %v", err))
	}
	if s.TenantID != "" {
		doc["server"]["tenant_id"] = s.TenantID
	}
	if s.Host != "" {
		doc["server"]["OS-EXT-SRV-ATTR:host"] = s.Host
		doc["server"]["OS-EXT-SRV-ATTR:hypervisor_hostname"] = s.Host
	}
	if s.Node != "" {
		doc["server"]["OS-EXT-SRV-ATTR:hypervisor_hostname"] = s.Node
	}
	b, _ := json.Marshal(doc)
	return b
}

// Nova is an http.Handler answering GET /v2.1/servers/{id} for its
// servers, 404 (Nova's itemNotFound body) for any other id, or Status
// for every call when set (Nova away: 503). It counts the calls and the
// most that were in flight at once.
type Nova struct {
	mu       sync.Mutex
	servers  map[string]Server
	status   int
	delay    time.Duration
	calls    map[string]int
	inFlight int
	maxIn    int
}

// New makes a Nova with servers.
func New(servers ...Server) *Nova {
	n := &Nova{servers: map[string]Server{}, calls: map[string]int{}}
	for _, s := range servers {
		n.servers[s.ID] = s
	}
	return n
}

// Add adds a server.
func (n *Nova) Add(s Server) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.servers[s.ID] = s
}

// Fail makes every call answer status (0: answer again).
func (n *Nova) Fail(status int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.status = status
}

// Slow makes every answer wait d.
func (n *Nova) Slow(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delay = d
}

// Calls is how many times id was asked for.
func (n *Nova) Calls(id string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[id]
}

// TotalCalls is how many calls came.
func (n *Nova) TotalCalls() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := 0
	for _, c := range n.calls {
		t += c
	}
	return t
}

// MaxInFlight is the most calls that were answered at once.
func (n *Nova) MaxInFlight() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.maxIn
}

// ServeHTTP implements http.Handler.
func (n *Nova) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutPrefix(r.URL.Path, "/v2.1/servers/")
	if r.Method != http.MethodGet || !ok || strings.Contains(id, "/") {
		http.NotFound(w, r)
		return
	}
	n.mu.Lock()
	n.calls[id]++
	n.inFlight++
	n.maxIn = max(n.maxIn, n.inFlight)
	s, found := n.servers[id]
	status, delay := n.status, n.delay
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.inFlight--
		n.mu.Unlock()
	}()
	time.Sleep(delay)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case status != 0:
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"computeFault": {"code": %d, "message": "The server has either erred or is incapable of performing the requested operation."}}`, status)
	case !found:
		// nova.api.openstack.common.get_instance: InstanceNotFound → 404.
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"itemNotFound": {"code": 404, "message": "Instance %s could not be found."}}`, id)
	default:
		w.Write(ServerGetResponse(s))
	}
}
