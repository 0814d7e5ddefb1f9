package apiclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Ready asks /readyz. When the bridge answers 503 the Readiness names each
// failing dependency and the error is an *Error with Status 503.
func (c *Client) Ready(ctx context.Context) (Readiness, error) {
	var r Readiness
	raw, err := c.callInto(ctx, Call{Method: http.MethodGet, Path: "/readyz", NoAuth: true}, &r)
	r.Raw = raw
	if e, ok := AsError(err); ok && e.Status == http.StatusServiceUnavailable {
		r = Readiness{Status: "not ready", Checks: map[string]string{}, Raw: e.Body}
		for _, p := range e.Problem.InvalidParams {
			r.Checks[p.Name] = p.Reason
		}
	}
	return r, err
}

// Hosts lists the compute nodes holding GPUs.
func (c *Client) Hosts(ctx context.Context) (HostList, error) {
	var out HostList
	raw, err := c.getInto(ctx, "/v1/hosts", nil, &out)
	out.Raw = raw
	return out, err
}

// Host returns one host, by compute service host or node name, with its GPUs.
func (c *Client) Host(ctx context.Context, name string) (Host, error) {
	var out Host
	raw, err := c.getInto(ctx, "/v1/hosts/"+url.PathEscape(name), nil, &out)
	out.Raw = raw
	return out, err
}

// HostReport returns the last agent report of a host (by compute service
// host or node name), as the bridge keeps it.
func (c *Client) HostReport(ctx context.Context, name string) (HostReport, error) {
	var out HostReport
	raw, err := c.getInto(ctx, "/v1/hosts/"+url.PathEscape(name)+"/report", nil, &out)
	out.Raw = raw
	return out, err
}

// GPUs lists physical GPUs.
func (c *Client) GPUs(ctx context.Context, f GPUFilter) (GPUList, error) {
	q := url.Values{}
	set(q, "host", f.Host)
	set(q, "trait", f.Trait)
	set(q, "profile", f.Profile)
	var out GPUList
	raw, err := c.getInto(ctx, "/v1/gpus", q, &out)
	out.Raw = raw
	return out, err
}

// Instances returns a page of instances.
func (c *Client) Instances(ctx context.Context, f InstanceFilter) (InstanceList, error) {
	q := url.Values{}
	set(q, "host", f.Host)
	set(q, "project", f.Project)
	if f.HasVGPU != nil {
		q.Set("has_vgpu", strconv.FormatBool(*f.HasVGPU))
	}
	if f.Deleted {
		q.Set("deleted", "true")
	}
	setInt(q, "limit", f.Limit)
	set(q, "cursor", f.Cursor)
	var out InstanceList
	raw, err := c.getInto(ctx, "/v1/instances", q, &out)
	out.Raw = raw
	return out, err
}

// Instance returns one instance.
func (c *Client) Instance(ctx context.Context, uuid string) (Instance, error) {
	var out Instance
	raw, err := c.getInto(ctx, "/v1/instances/"+url.PathEscape(uuid), nil, &out)
	out.Raw = raw
	return out, err
}

// Requests lists requests, newest first.
func (c *Client) Requests(ctx context.Context, f RequestFilter) (RequestList, error) {
	q := url.Values{}
	set(q, "source", f.Source)
	set(q, "state", f.State)
	set(q, "instance_uuid", f.InstanceUUID)
	setInt(q, "limit", f.Limit)
	var out RequestList
	raw, err := c.getInto(ctx, "/v1/requests", q, &out)
	out.Raw = raw
	return out, err
}

// Request returns one request.
func (c *Client) Request(ctx context.Context, id string) (Request, error) {
	var out Request
	raw, err := c.getInto(ctx, "/v1/requests/"+url.PathEscape(id), nil, &out)
	out.Raw = raw
	return out, err
}

// NewRequest is the body of POST /v1/requests (the native webhook body).
type NewRequest struct {
	Type        string `json:"type"` // GPU_REQUEST, GPU_RESIZE, GPU_RELEASE
	VMID        string `json:"vm_id"`
	Workload    string `json:"workload,omitempty"`
	VGPUProfile string `json:"vgpu_profile,omitempty"`
	Count       int    `json:"count,omitempty"`
}

// CreateRequest asks for a change with the client's credentials (admin,
// or a member for its project's instances); key, when set, is the
// Idempotency-Key, so that a retry gets the first answer.
func (c *Client) CreateRequest(ctx context.Context, r NewRequest, key string) (WebhookAnswer, error) {
	var out WebhookAnswer
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/requests", Body: r, Header: h}, &out)
	out.Raw = raw
	return out, err
}

// CancelRequest cancels a request that is not final yet (admin); it ends
// failed with code "cancelled". A final request answers 409.
func (c *Client) CancelRequest(ctx context.Context, id string) (Request, error) {
	var out Request
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/requests/" + url.PathEscape(id) + "/cancel"}, &out)
	out.Raw = raw
	return out, err
}

// WatchRequest polls a request every interval until it reaches a final
// state or ctx ends. seen, when not nil, is called with every answer whose
// state or phase differs from the previous one (and with the first).
// Once the request has been read, transient failures (unreachable, 5xx)
// are retried; any other failure ends the watch.
func (c *Client) WatchRequest(ctx context.Context, id string, interval time.Duration, seen func(Request)) (Request, error) {
	if interval <= 0 {
		interval = time.Second
	}
	var last Request
	first := true
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-t.C:
		}
		r, err := c.Request(ctx, id)
		switch {
		case err == nil:
			if seen != nil && (first || r.State != last.State || r.Phase != last.Phase) {
				seen(r)
			}
			first = false
			last = r
			if FinalState(r.State) {
				return r, nil
			}
		case ctx.Err() != nil:
			return last, ctx.Err()
		case !first && (IsUnreachable(err) || StatusCode(err) >= 500):
			// keep polling: a bridge restart or a failover is not the end
		default:
			return last, err
		}
		t.Reset(interval)
	}
}

// Events returns a page of events, oldest first.
func (c *Client) Events(ctx context.Context, f EventFilter) (EventList, error) {
	q := url.Values{}
	set(q, "instance", f.Instance)
	set(q, "type", f.Type)
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if f.Payload {
		q.Set("payload", "true")
	}
	setInt(q, "limit", f.Limit)
	set(q, "cursor", f.Cursor)
	var out EventList
	raw, err := c.getInto(ctx, "/v1/events", q, &out)
	out.Raw = raw
	return out, err
}

// DeadLetters returns a page of dead letters, newest first (admin).
func (c *Client) DeadLetters(ctx context.Context, f DeadLetterFilter) (DeadLetterList, error) {
	q := url.Values{}
	set(q, "reason", f.Reason)
	set(q, "source", f.Source)
	setInt(q, "limit", f.Limit)
	set(q, "cursor", f.Cursor)
	var out DeadLetterList
	raw, err := c.getInto(ctx, "/v1/dead-letters", q, &out)
	out.Raw = raw
	return out, err
}

// Allocations lists vGPU allocations, of one instance when instance is set.
func (c *Client) Allocations(ctx context.Context, instance string) (AllocationList, error) {
	q := url.Values{}
	set(q, "instance", instance)
	var out AllocationList
	raw, err := c.getInto(ctx, "/v1/allocations", q, &out)
	out.Raw = raw
	return out, err
}

// DryRun ranks the GPUs able to hold a request, without claiming.
func (c *Client) DryRun(ctx context.Context, req DryRunRequest) (DryRunResponse, error) {
	var out DryRunResponse
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/placements/dry-run", Body: req}, &out)
	out.Raw = raw
	return out, err
}

// Sync makes the bridge sync its Placement mirror now (admin): incremental,
// or every provider with full. A sync already running answers 409 with
// Retry-After.
func (c *Client) Sync(ctx context.Context, full bool) (SyncResult, error) {
	q := url.Values{}
	if full {
		q.Set("full", "true")
	}
	var out SyncResult
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/placements/sync", Query: q}, &out)
	out.Raw = raw
	return out, err
}

// RetypeGPU re-types the empty bridge-owned VF GPU pf of host to typeID
// (admin, audited).
func (c *Client) RetypeGPU(ctx context.Context, host, pf, typeID string) (RetypeResult, error) {
	var out RetypeResult
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/hosts/" + url.PathEscape(host) + "/gpus/" + url.PathEscape(pf) + "/retype",
		Body: map[string]string{"type_id": typeID}}, &out)
	out.Raw = raw
	return out, err
}

// Explain asks the active policy what it decides for body, which is
// {"event": {...}} with an optional "state".
func (c *Client) Explain(ctx context.Context, body json.RawMessage) (Explanation, error) {
	var out Explanation
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/policy/explain", Body: body}, &out)
	out.Raw = raw
	return out, err
}

// ReplayPolicy runs the recorded events of a window through the active
// policy and a candidate rules file, with no side effect (admin).
func (c *Client) ReplayPolicy(ctx context.Context, req PolicyReplayRequest) (PolicyReplay, error) {
	var out PolicyReplay
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/policy/replay", Body: req}, &out)
	out.Raw = raw
	return out, err
}

func set(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

func setInt(q url.Values, k string, n int) {
	if n != 0 {
		q.Set(k, strconv.Itoa(n))
	}
}
