package computeapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi/computeapitest"
)

// TestServerDetail reads Nova's own GET /servers/{id} sample into the
// Detail a listing gives, and tells a 404 and an unreachable Nova apart.
func TestServerDetail(t *testing.T) {
	const id = "9b2f6a2e-3c7d-4d8e-9f10-1a2b3c4d5e6f"
	updated := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	nova := computeapitest.New(computeapitest.Server{ID: id, TenantID: "p1", Host: "cmp1", Updated: updated})
	srv := httptest.NewServer(nova)
	defer srv.Close()
	c, err := New(context.Background(), Config{Endpoint: srv.URL + "/v2.1", Token: "admin:admin"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := c.ServerDetail(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	want := Detail{Server: Server{ID: id, Name: "new-server-test", Status: "ACTIVE", VMState: "active", Host: "cmp1", Node: "cmp1",
		Flavor: Flavor{Name: "m1.tiny", VCPUs: 1, RAM: 512, Disk: 1, ExtraSpecs: map[string]string{}}},
		ProjectID: "p1", UserID: "admin", AvailabilityZone: "nova", PowerState: 1, Created: updated, Updated: updated,
		Metadata: map[string]string{"My Server Name": "Apache1"}}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("got  %+v\nwant %+v", d, want)
	}
	if _, err := c.ServerDetail(ctx, "3f1e0d2c-0000-4000-8000-000000000000", ""); !IsNotFound(err) {
		t.Errorf("a server Nova does not have: %v, want not found", err)
	}
	if _, err := c.ServerDetail(ctx, "../flavors/detail", ""); !IsNotFound(err) {
		t.Errorf("an id that is no UUID: %v, want not found", err)
	}
	if nova.TotalCalls() != 2 {
		t.Errorf("Nova was called %d times, want 2 (an id that is no UUID is not sent)", nova.TotalCalls())
	}
	nova.Fail(http.StatusServiceUnavailable)
	if _, err := c.ServerDetail(ctx, id, ""); !IsRetryable(err) {
		t.Errorf("Nova answering 503: %v, want retryable", err)
	}
}
