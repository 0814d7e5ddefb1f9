package computeapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Detail is a server as GET /servers/detail lists it for an admin: what
// the bridge keeps of an instance it learns from Nova's API rather than
// from a notification.
type Detail struct {
	Server
	ProjectID        string
	UserID           string
	AvailabilityZone string
	// PowerState is Nova's power state code (nova/compute/power_state.py):
	// 0 no state, 1 running, 3 paused, 4 shutdown, 6 crashed, 7 suspended.
	PowerState int
	Created    time.Time
	Updated    time.Time
	Metadata   map[string]string
}

// Deleted reports whether the listing shows a deleted server (only a
// changes-since listing does).
func (d Detail) Deleted() bool { return d.Status == "DELETED" || d.VMState == "deleted" }

// ListServers says which servers to list.
type ListServers struct {
	// ChangesSince, when set, lists only the servers changed since then,
	// deleted ones included (Nova's changes-since filter); otherwise every
	// server not deleted.
	ChangesSince time.Time
	// PageSize is the servers asked for per request (Nova caps it at its
	// [api] max_limit, 1000 by default).
	PageSize int
}

// serverBody is one server of Nova's server and server-list answers.
type serverBody struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Status     string            `json:"status"`
	TenantID   string            `json:"tenant_id"`
	UserID     string            `json:"user_id"`
	VMState    string            `json:"OS-EXT-STS:vm_state"`
	TaskState  string            `json:"OS-EXT-STS:task_state"`
	PowerState int               `json:"OS-EXT-STS:power_state"`
	Host       string            `json:"OS-EXT-SRV-ATTR:host"`
	Node       string            `json:"OS-EXT-SRV-ATTR:hypervisor_hostname"`
	AZ         string            `json:"OS-EXT-AZ:availability_zone"`
	Created    time.Time         `json:"created"`
	Updated    time.Time         `json:"updated"`
	Metadata   map[string]string `json:"metadata"`
	Flavor     struct {
		OriginalName string            `json:"original_name"`
		VCPUs        int               `json:"vcpus"`
		RAM          int               `json:"ram"`
		Disk         int               `json:"disk"`
		Ephemeral    int               `json:"ephemeral"`
		Swap         int               `json:"swap"`
		ExtraSpecs   map[string]string `json:"extra_specs"`
	} `json:"flavor"`
	Fault *struct {
		Message string `json:"message"`
	} `json:"fault"`
}

func (s serverBody) server() Server {
	srv := Server{ID: s.ID, Name: s.Name, Status: s.Status, VMState: s.VMState, TaskState: s.TaskState, Host: s.Host, Node: s.Node,
		Flavor: Flavor{Name: s.Flavor.OriginalName, VCPUs: s.Flavor.VCPUs, RAM: s.Flavor.RAM, Disk: s.Flavor.Disk,
			Ephemeral: s.Flavor.Ephemeral, Swap: s.Flavor.Swap, ExtraSpecs: s.Flavor.ExtraSpecs}}
	if s.Fault != nil {
		srv.Fault = s.Fault.Message
	}
	return srv
}

func (s serverBody) detail() Detail {
	return Detail{Server: s.server(), ProjectID: s.TenantID, UserID: s.UserID, AvailabilityZone: s.AZ, PowerState: s.PowerState,
		Created: s.Created, Updated: s.Updated, Metadata: s.Metadata}
}

// ServerDetail reads one server of any project as an admin sees it (GET
// /servers/{id}, the same body as one server of the listing): what the
// bridge keeps of an instance it looks up on demand. A server Nova does not
// have, or has deleted, is a KindNotFound error (IsNotFound): Nova's
// nova.api.openstack.compute.servers.ServersController.show reads the
// instance with read_deleted "no" (nova.api.openstack.common.get_instance).
func (c *Client) ServerDetail(ctx context.Context, id, requestID string) (Detail, error) {
	op := "GET /servers/" + id
	if _, err := uuid.Parse(id); err != nil {
		// Nova answers 404 to an id that is not a UUID; the bridge does not
		// put it in a URL.
		return Detail{}, &Error{Op: "GET /servers/{id}", Kind: KindNotFound, Status: http.StatusNotFound, Err: fmt.Errorf("%q is not a server id", id)}
	}
	var out serverJSON
	o := c.opts(requestID, http.StatusOK)
	o.JSONResponse = &out
	if _, err := c.sc.Request(ctx, http.MethodGet, c.sc.ServiceURL("servers", id), o); err != nil {
		return Detail{}, classify(op, err)
	}
	if out.Server.ID != id {
		return Detail{}, &Error{Op: op, Kind: KindFinal, Err: fmt.Errorf("the answer names server %q", out.Server.ID)}
	}
	return out.Server.detail(), nil
}

// maxServerPages bounds one listing: a marker Nova keeps answering with
// full pages would otherwise loop for ever.
const maxServerPages = 100000

// EachServerPage lists every project's servers (GET /servers/detail with
// all_tenants, admin), page by page in Nova's order, and gives each page
// to fn before asking for the next; an error of fn ends the listing.
func (c *Client) EachServerPage(ctx context.Context, o ListServers, requestID string, fn func([]Detail) error) error {
	size := o.PageSize
	if size <= 0 {
		size = 1000
	}
	marker := ""
	for range maxServerPages {
		q := url.Values{"all_tenants": {"1"}, "limit": {strconv.Itoa(size)}}
		if !o.ChangesSince.IsZero() {
			q.Set("changes-since", o.ChangesSince.UTC().Format(time.RFC3339))
		}
		if marker != "" {
			q.Set("marker", marker)
		}
		var out struct {
			Servers []serverBody `json:"servers"`
		}
		ro := c.opts(requestID, http.StatusOK)
		ro.JSONResponse = &out
		if _, err := c.sc.Request(ctx, http.MethodGet, c.sc.ServiceURL("servers", "detail")+"?"+q.Encode(), ro); err != nil {
			return classify("GET /servers/detail", err)
		}
		page := make([]Detail, 0, len(out.Servers))
		for _, s := range out.Servers {
			if s.ID == "" {
				return &Error{Op: "GET /servers/detail", Kind: KindFinal, Err: errors.New("a listed server has no id")}
			}
			page = append(page, s.detail())
		}
		if len(page) > 0 {
			if err := fn(page); err != nil {
				return err
			}
		}
		// Nova ends a listing with a page shorter than the limit (it may
		// answer a full last page; the next one is then empty).
		if len(out.Servers) < size {
			return nil
		}
		marker = out.Servers[len(out.Servers)-1].ID
	}
	return &Error{Op: "GET /servers/detail", Kind: KindFinal, Err: errors.New("the listing did not end")}
}
