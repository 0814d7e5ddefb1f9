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
	dir := t.TempDir()
	h, err := fakehost.Build(dir, fakehost.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	// One vGPU encodes and decodes (a VDI session); the others do not.
	if err := fakehost.SetVGPUCodecLoad(dir, "4b20d080-1b54-4048-85b3-a6a62d165c01", 85, 30, 12); err != nil {
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
		`vgpu_agent_vgpu_framebuffer_used_bytes{Hostname="fake-compute-0",UUID="GPU-`,
		`vgpu_agent_gpu_temperature_celsius{Hostname="fake-compute-0",UUID="GPU-`,
		`vgpu_agent_gpu_framebuffer_used_bytes{Hostname="fake-compute-0",UUID="GPU-`,
		`gpu="0",modelName="Tesla T4",pci_bus_id="00000000:3B:00.0"} 45`,
	} {
		if !strings.Contains(out, s) {
			t.Errorf("missing %s in\n%s", s, out)
		}
	}
	// The busy vGPU's series carry the GPU's labels (the DCGM exporter's) and the instance.
	const vgpu = `gpu="0",instance_uuid="0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01",modelName="Tesla T4",pci_bus_id="00000000:3B:00.0",` +
		`vgpu="4b20d080-1b54-4048-85b3-a6a62d165c01",vgpu_type="nvidia-232"}`
	for _, c := range []struct{ name, labels, want string }{
		{"vgpu_agent_vgpu_utilization_percent", vgpu, "85"},
		{"vgpu_agent_vgpu_encoder_utilization_percent", vgpu, "30"},
		{"vgpu_agent_vgpu_decoder_utilization_percent", vgpu, "12"},
		{"vgpu_agent_vgpu_framebuffer_used_bytes", vgpu, "1.073741824e+09"},
		{"vgpu_agent_gpu_encoder_utilization_percent", `modelName="Tesla T4",pci_bus_id="00000000:3B:00.0"}`, "30"},
		{"vgpu_agent_gpu_decoder_utilization_percent", `modelName="Tesla T4",pci_bus_id="00000000:3B:00.0"}`, "12"},
	} {
		var got []string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, c.name+"{") && strings.Contains(line, c.labels) {
				got = append(got, line[strings.LastIndexByte(line, ' ')+1:])
			}
		}
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("%s{…%s = %v, want one series of %s", c.name, c.labels, got, c.want)
		}
	}
	// The agent's own names only: dcgm-exporter may export DCGM_FI_* on
	// the same host, and a sum over both would count each GPU twice.
	if strings.Contains(out, "DCGM_FI_") {
		t.Errorf("a DCGM_FI_* series on the agent's /metrics:\n%s", out)
	}
	if cs.n != 1 {
		t.Errorf("scans = %d, want 1 (cached within MinInterval)", cs.n)
	}
}
