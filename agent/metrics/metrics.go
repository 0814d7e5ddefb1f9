// Package metrics exports the host's GPU and vGPU state on the agent's
// /metrics. Per-GPU series use the DCGM exporter's names and labels
// (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, …, labels gpu, UUID,
// pci_bus_id, modelName, Hostname) so existing dashboards work. Per-vGPU
// series follow the same pattern (DCGM_FI_DEV_VGPU_UTIL, …), with the
// GPU's labels and vgpu, vgpu_type and instance_uuid (the Nova instance;
// not "instance", which Prometheus gives the scrape target). What DCGM
// has no name for is vgpu_agent_*.
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
	dUtil    = desc("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", gpuLabels...)
	dMemUtil = desc("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", gpuLabels...)
	dFBUsed  = desc("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", gpuLabels...)
	dFBFree  = desc("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", gpuLabels...)
	dFBTotal = desc("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", gpuLabels...)
	dTemp    = desc("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", gpuLabels...)
	dPower   = desc("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", gpuLabels...)
	dSMClk   = desc("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", gpuLabels...)
	dMemClk  = desc("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", gpuLabels...)
	dEnc     = desc("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", gpuLabels...)
	dDec     = desc("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", gpuLabels...)

	dVUtil = desc("DCGM_FI_DEV_VGPU_UTIL", "Utilization of one vGPU (in %, NVML's SM sample).", vgpuLabels...)
	dVFB   = desc("DCGM_FI_DEV_VGPU_FB_USED", "Framebuffer used inside one vGPU (in MiB).", vgpuLabels...)
	dVEnc  = desc("DCGM_FI_DEV_VGPU_ENC_UTIL", "Encoder utilization of one vGPU (in %).", vgpuLabels...)
	dVDec  = desc("DCGM_FI_DEV_VGPU_DEC_UTIL", "Decoder utilization of one vGPU (in %).", vgpuLabels...)

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
		var l []string // the GPU's DCGM labels, when NVML names it
		if inv.NVML && gp.UUID != "" {
			l = []string{strconv.Itoa(i), gp.UUID, gp.Addr.NVML(), gp.Name, inv.Host}
			g(dUtil, float64(gp.Utilization.GPU), l...)
			g(dMemUtil, float64(gp.Utilization.Memory), l...)
			g(dFBUsed, float64(gp.Memory.Used>>20), l...)
			g(dFBFree, float64(gp.Memory.Free>>20), l...)
			g(dFBTotal, float64(gp.Memory.Total>>20), l...)
			g(dTemp, float64(gp.TemperatureC), l...)
			g(dPower, float64(gp.PowerMW)/1000, l...)
			g(dSMClk, float64(gp.Clocks.SM), l...)
			g(dMemClk, float64(gp.Clocks.Mem), l...)
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
				g(dVFB, float64(v.FBUsage>>20), vl...)
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
