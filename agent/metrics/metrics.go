// Package metrics exports the host's GPU and vGPU state on the agent's
// /metrics, every series named vgpu_agent_* in base units (bytes, hertz,
// watts, celsius; utilisations in percent). The names are the agent's own:
// NVIDIA's dcgm-exporter often runs on the same hosts, and series under
// its DCGM_FI_* names would be counted twice by any sum over them. The
// per-GPU labels are the DCGM exporter's (gpu, UUID, pci_bus_id,
// modelName, Hostname), so the two join; per-vGPU series add vgpu,
// vgpu_type and instance_uuid (the Nova instance; not "instance", which
// Prometheus gives the scrape target).
package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
)

// Scanner produces inventories (*inventory.Scanner).
type Scanner interface {
	Scan(ctx context.Context) (*inventory.Inventory, error)
}

// Collector is a prometheus.Collector that scans the host when scraped, at
// most once per MinInterval (scrapes in between reuse the last scan).
type Collector struct {
	scan        Scanner
	minInterval time.Duration
	timeout     time.Duration
	now         func() time.Time

	mu   sync.Mutex
	last *inventory.Inventory
	at   time.Time
}

// New returns a collector over s; minInterval 0 means 5 s.
func New(s Scanner, minInterval time.Duration) *Collector {
	if minInterval == 0 {
		minInterval = 5 * time.Second
	}
	return &Collector{scan: s, minInterval: minInterval, timeout: 10 * time.Second, now: time.Now}
}

var (
	gpuLabels  = []string{"gpu", "UUID", "pci_bus_id", "modelName", "Hostname"}
	vgpuLabels = append(gpuLabels[:len(gpuLabels):len(gpuLabels)], "vgpu", "vgpu_type", "instance_uuid")
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	dUtil    = desc("vgpu_agent_gpu_utilization_percent", "GPU utilization, percent.", gpuLabels...)
	dMemUtil = desc("vgpu_agent_gpu_memory_utilization_percent", "Memory (copy engine) utilization, percent.", gpuLabels...)
	dFBUsed  = desc("vgpu_agent_gpu_framebuffer_used_bytes", "Framebuffer memory used, bytes.", gpuLabels...)
	dFBFree  = desc("vgpu_agent_gpu_framebuffer_free_bytes", "Framebuffer memory free, bytes.", gpuLabels...)
	dFBTotal = desc("vgpu_agent_gpu_framebuffer_size_bytes", "Framebuffer memory, bytes.", gpuLabels...)
	dTemp    = desc("vgpu_agent_gpu_temperature_celsius", "GPU temperature, degrees Celsius.", gpuLabels...)
	dPower   = desc("vgpu_agent_gpu_power_watts", "Power draw, watts.", gpuLabels...)
	dSMClk   = desc("vgpu_agent_gpu_sm_clock_hertz", "SM clock frequency, hertz.", gpuLabels...)
	dMemClk  = desc("vgpu_agent_gpu_memory_clock_hertz", "Memory clock frequency, hertz.", gpuLabels...)
	dEnc     = desc("vgpu_agent_gpu_encoder_utilization_percent", "Encoder utilization, percent.", gpuLabels...)
	dDec     = desc("vgpu_agent_gpu_decoder_utilization_percent", "Decoder utilization, percent.", gpuLabels...)

	dVUtil = desc("vgpu_agent_vgpu_utilization_percent", "Utilization of one vGPU, percent (NVML's SM sample).", vgpuLabels...)
	dVFB   = desc("vgpu_agent_vgpu_framebuffer_used_bytes", "Framebuffer used inside one vGPU, bytes.", vgpuLabels...)
	dVEnc  = desc("vgpu_agent_vgpu_encoder_utilization_percent", "Encoder utilization of one vGPU, percent.", vgpuLabels...)
	dVDec  = desc("vgpu_agent_vgpu_decoder_utilization_percent", "Decoder utilization of one vGPU, percent.", vgpuLabels...)

	dHealth    = desc("vgpu_agent_gpu_health", "1 for the GPU's current health state (ok, degraded, failed, unknown).", "pci_bus_id", "state")
	dAvailable = desc("vgpu_agent_available_instances", "Instances of a vGPU type that can still be created on a GPU.", "pci_bus_id", "type", "type_name")
	dInUse     = desc("vgpu_agent_vgpu_instances", "vGPUs of a type that exist on a GPU.", "pci_bus_id", "type", "type_name")
	dVLicensed = desc("vgpu_agent_vgpu_licensed", "1 when the vGPU's guest holds a valid licence, 0 when not (absent when unknown).", "pci_bus_id", "vgpu", "instance_uuid")
	dNVML      = desc("vgpu_agent_nvml_up", "1 when NVML answers.")
	dOrphans   = desc("vgpu_agent_orphan_vgpus", "vGPUs no libvirt domain uses.")
	dScanOK    = desc("vgpu_agent_inventory_scan_success", "1 when the last inventory scan succeeded without source errors.")
	dScanAge   = desc("vgpu_agent_inventory_scan_timestamp_seconds", "Unix time of the inventory scan these values come from.")
)

// Describe sends every descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dUtil, dMemUtil, dFBUsed, dFBFree, dFBTotal, dTemp, dPower, dSMClk, dMemClk, dEnc, dDec,
		dVUtil, dVFB, dVEnc, dVDec, dHealth, dAvailable, dInUse, dVLicensed, dNVML, dOrphans, dScanOK, dScanAge} {
		ch <- d
	}
}

func (c *Collector) inventory() (*inventory.Inventory, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && c.now().Sub(c.at) < c.minInterval {
		return c.last, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	inv, err := c.scan.Scan(ctx)
	if err != nil {
		return c.last, false
	}
	c.last, c.at = inv, c.now()
	return inv, len(inv.Errors) == 0
}

// Collect scans (or reuses the last scan) and sends the series.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	inv, ok := c.inventory()
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	g(dScanOK, b2f(ok))
	if inv == nil {
		return
	}
	g(dScanAge, float64(inv.CollectedAt.Unix()))
	g(dNVML, b2f(inv.NVML))
	g(dOrphans, float64(len(inv.Orphans)))
	for i, gp := range inv.GPUs {
		pciID := gp.Addr.String()
		g(dHealth, 1, pciID, gp.Health)
		var l []string // the GPU's labels (the DCGM exporter's), when NVML names it
		if inv.NVML && gp.UUID != "" {
			l = []string{strconv.Itoa(i), gp.UUID, gp.Addr.NVML(), gp.Name, inv.Host}
			g(dUtil, float64(gp.Utilization.GPU), l...)
			g(dMemUtil, float64(gp.Utilization.Memory), l...)
			g(dFBUsed, float64(gp.Memory.Used), l...)
			g(dFBFree, float64(gp.Memory.Free), l...)
			g(dFBTotal, float64(gp.Memory.Total), l...)
			g(dTemp, float64(gp.TemperatureC), l...)
			g(dPower, float64(gp.PowerMW)/1000, l...)
			g(dSMClk, float64(gp.Clocks.SM)*1e6, l...) // NVML says MHz
			g(dMemClk, float64(gp.Clocks.Mem)*1e6, l...)
			g(dEnc, float64(gp.Utilization.Encoder), l...)
			g(dDec, float64(gp.Utilization.Decoder), l...)
		}
		for _, t := range gp.Types {
			g(dAvailable, float64(t.Available), pciID, t.ID, t.Name)
			if t.InUse > 0 {
				g(dInUse, float64(t.InUse), pciID, t.ID, t.Name)
			}
		}
		for _, v := range gp.VGPUs {
			if l != nil && v.Running {
				vl := append(l[:len(l):len(l)], v.ID, v.Type, v.Instance)
				g(dVUtil, float64(v.UtilPct), vl...)
				g(dVFB, float64(v.FBUsage), vl...)
				g(dVEnc, float64(v.EncoderPct), vl...)
				g(dVDec, float64(v.DecoderPct), vl...)
			}
			if v.Licensed != nil {
				g(dVLicensed, b2f(*v.Licensed), pciID, v.ID, v.Instance)
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
