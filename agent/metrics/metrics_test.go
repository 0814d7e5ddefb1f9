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
		`DCGM_FI_DEV_VGPU_FB_USED{Hostname="fake-compute-0",UUID="GPU-`,
		`DCGM_FI_DEV_GPU_TEMP{Hostname="fake-compute-0",UUID="GPU-`,
		`DCGM_FI_DEV_FB_USED{Hostname="fake-compute-0",UUID="GPU-`,
		`gpu="0",modelName="Tesla T4",pci_bus_id="00000000:3B:00.0"} 45`,
	} {
		if !strings.Contains(out, s) {
			t.Errorf("missing %s in\n%s", s, out)
		}
	}
	// The busy vGPU's series carry the GPU's DCGM labels and the instance.
	const vgpu = `gpu="0",instance_uuid="0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01",modelName="Tesla T4",pci_bus_id="00000000:3B:00.0",` +
		`vgpu="4b20d080-1b54-4048-85b3-a6a62d165c01",vgpu_type="nvidia-232"}`
	for _, c := range []struct{ name, labels, want string }{
		{"DCGM_FI_DEV_VGPU_UTIL", vgpu, "85"},
		{"DCGM_FI_DEV_VGPU_ENC_UTIL", vgpu, "30"},
		{"DCGM_FI_DEV_VGPU_DEC_UTIL", vgpu, "12"},
		{"DCGM_FI_DEV_VGPU_FB_USED", vgpu, "1024"},
		{"DCGM_FI_DEV_ENC_UTIL", `modelName="Tesla T4",pci_bus_id="00000000:3B:00.0"}`, "30"},
		{"DCGM_FI_DEV_DEC_UTIL", `modelName="Tesla T4",pci_bus_id="00000000:3B:00.0"}`, "12"},
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
	if cs.n != 1 {
		t.Errorf("scans = %d, want 1 (cached within MinInterval)", cs.n)
	}
}
