package policy

import (
	"fmt"
	"strings"
	"time"
)

// BenchPolicy returns a policy document of n rules shaped like a real one:
// requests by workload and project, load thresholds with hysteresis,
// alerts by label, Nova lifecycle events. The benchmarks use it.
func BenchPolicy(n int) string {
	var b strings.Builder
	b.WriteString("version: 1\ndefaults:\n  quota: {max_vgpus: 64, max_framebuffer_gib: 512, max_vgpus_per_vm: 4}\nrules:\n")
	workloads := []string{"training", "inference", "rendering", "vdi", "gaming"}
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - name: r%03d\n", i)
		switch i % 10 {
		case 0, 1, 2:
			// Per-project request rules, as operators write them: one
			// project's rule matches an event.
			fmt.Fprintf(&b, "    on: [webhook.GPU_REQUEST]\n    when: event.workload == %q && project.id == \"p%d\" && project.vgpus < %d && preferred != \"\"\n    then: ['attach(preferred, event.count > 0 ? event.count : 1)']\n",
				workloads[i%5], i, 10+i)
		case 3, 4:
			fmt.Fprintf(&b, "    on: [webhook.GPU_LOAD]\n    when: has(metrics.gpu_util) && metrics.gpu_util > %d.0 && instance.profile != \"\" && larger(instance.profile) != \"\"\n    for: 5m\n    cooldown: 15m\n    then: ['resize(larger(instance.profile))']\n", 80+i%20)
		case 5:
			fmt.Fprintf(&b, "    on: [webhook.GPU_LOAD]\n    when: has(metrics.gpu_util) && metrics.gpu_util < %d.0 && instance.vgpu_count > 0\n    for: 30m\n    then: ['resize(smaller(instance.profile))']\n", 5+i%20)
		case 6:
			fmt.Fprintf(&b, "    on: [alert]\n    when: event.status == \"firing\" && event.labels.exists(k, k == \"alertname\") && event.labels[\"alertname\"] == \"GPUHot%d\"\n    then: ['notify(\"hot \" + instance.uuid)']\n", i)
		case 7:
			fmt.Fprintf(&b, "    on: [alert]\n    when: event.status == \"firing\" && has(metrics.fb_used_mib) && metrics.fb_used_mib > %d.0\n    then: ['set_limits(\"max 100000\", \"%dG\")']\n", 1000*i, 8+i%32)
		case 8:
			fmt.Fprintf(&b, "    on: [nova.instance.delete.end, nova.instance.shelve*]\n    when: instance.vgpu_count > 0 && instance.project_id != \"p%d\"\n    then: ['release()']\n", i)
		case 9:
			fmt.Fprintf(&b, "    on: [webhook.GPU_RELEASE, webhook.GPU_RESIZE]\n    when: event.source == \"sched%d\" || event.profile != \"\"\n    then: ['notify(\"change by \" + event.source)']\n", i)
		}
	}
	return b.String()
}

// BenchEvents returns realistic events for BenchPolicy and a state for
// them.
func BenchEvents(at time.Time) ([]Event, *MemState) {
	st := &MemState{
		HostList: []Host{
			{Name: "cmp1", Hypervisor: "KVM", DriverVersion: "535.104.06", GPUs: []GPU{{Address: "0000:81:00.0", Model: "T4", Profile: "T4-4Q", Used: 2, Capacity: 4}}},
			{Name: "cmp2", Hypervisor: "KVM", DriverVersion: "470.82.01", GPUs: []GPU{{Address: "0000:41:00.0", Model: "T4"}}},
		},
		Instances: []Instance{
			{UUID: "vm1", ProjectID: "p1", Host: "cmp1", State: "active", VGPUs: []VGPU{{Profile: "T4-4Q", Count: 1, GPU: "0000:81:00.0"}}},
			{UUID: "vm2", ProjectID: "p2", Host: "cmp1", State: "active"},
		},
		Usage: map[string]Usage{"p1": {VGPUs: 1, FramebufferMiB: 4096}},
	}
	evs := []Event{
		{Kind: KindGPURequest, Source: "sched", InstanceUUID: "vm2", ProjectID: "p0", Workload: "training", Count: 1, Time: at},
		{Kind: KindGPURequest, Source: "sched", InstanceUUID: "vm2", ProjectID: "p2", Workload: "rendering", GuestDriver: "535.104.05", Time: at},
		{Kind: KindGPULoad, Source: "dcgm", InstanceUUID: "vm1", Metrics: map[string]float64{"gpu_util": 97, "fb_used_mib": 3900}, Time: at},
		{Kind: KindGPULoad, Source: "dcgm", InstanceUUID: "vm1", Metrics: map[string]float64{"gpu_util": 12}, Time: at},
		{Kind: KindAlert, Source: "am", InstanceUUID: "vm1", Status: "firing", Labels: map[string]string{"alertname": "GPUHot16", "instance": "vm1"}, Metrics: map[string]float64{"fb_used_mib": 15000}, Time: at},
		{Kind: "nova.instance.delete.end", Source: "nova", InstanceUUID: "vm1", Time: at},
		{Kind: KindGPURelease, Source: "sched19", InstanceUUID: "vm1", Time: at},
	}
	return evs, st
}
