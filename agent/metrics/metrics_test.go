package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"net/http/httptest"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/metrics"
)

type countingScanner struct {
	s *inventory.Scanner
	n int
}

func (c *countingScanner) Scan(ctx context.Context) (*inventory.Inventory, error) {
	c.n++
	return c.s.Scan(ctx)
}

func TestCollector(t *testing.T) {
	h, err := fakehost.Build(t.TempDir(), fakehost.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := libvirt.Open(h.LibvirtURI())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b, _ := h.NVML()
	defer b.Close()
	cs := &countingScanner{s: &inventory.Scanner{Host: "fake-compute-0", Sysfs: h.Sysfs, Domains: conn, GPUs: b}}
	c := metrics.New(cs, time.Hour)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	scrape := func() string {
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	scrape()
	out := scrape()
	for _, s := range []string{
		`vgpu_agent_available_instances{pci_bus_id="0000:3b:00.0",type="nvidia-232",type_name="GRID T4-4Q"} 3`,
		`vgpu_agent_available_instances{pci_bus_id="0000:d8:00.0",type="nvidia-222",type_name="GRID T4-1B"} 16`,
		`vgpu_agent_available_instances{pci_bus_id="0000:c1:00.0",type="1429",type_name="NVIDIA H200X-70C"} 1`,
		`vgpu_agent_vgpu_utilization_percent{instance_uuid="0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01",pci_bus_id="0000:3b:00.0",type="nvidia-232",vgpu="4b20d080-1b54-4048-85b3-a6a62d165c01"} 40`,
		`DCGM_FI_DEV_GPU_TEMP{Hostname="fake-compute-0",UUID="GPU-`,
		`DCGM_FI_DEV_FB_USED{Hostname="fake-compute-0",UUID="GPU-`,
		`gpu="0",modelName="Tesla T4",pci_bus_id="00000000:3B:00.0"} 45`,
	} {
		if !strings.Contains(out, s) {
			t.Errorf("missing %s in\n%s", s, out)
		}
	}
	if cs.n != 1 {
		t.Errorf("scans = %d, want 1 (cached within MinInterval)", cs.n)
	}
}
