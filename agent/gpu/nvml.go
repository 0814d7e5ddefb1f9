package gpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// NVML is the Backend over an nvml.Interface: the real library or a mock.
type NVML struct {
	lib nvml.Interface
	// checkSymbols: before calling a function newer drivers added, look it
	// up in the loaded library (calling a missing symbol crashes). Mocks
	// have no library to look into.
	checkSymbols bool

	mu     sync.Mutex // serialises writes; closed guards use after Close
	closed bool

	// The fault watch (GPUs): NVML's event set, the GPUs registered on
	// it (by UUID), the faults its events told (by UUID; they stay until
	// the agent restarts, as the GPU needs a reset anyway), and each
	// index's last address (a lost GPU no longer tells it).
	events      nvml.EventSet
	eventsErr   string
	registered  map[string]bool
	eventFaults map[string]Fault
	lastAddr    map[int]pci.Addr
}

var _ Backend = (*NVML)(nil)

// Open loads the real NVML and initialises it. On any failure it returns
// an NVMLUnavailable error and has made no call but Init.
func Open() (*NVML, error) {
	return Init(nvml.New(), true)
}

// Init initialises lib. When lib.Init fails, the error is returned and no
// other function of lib is called, ever.
func Init(lib nvml.Interface, checkSymbols bool) (*NVML, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, hosterr.Errorf(hosterr.NVMLUnavailable, "nvml init", "%s", errString(ret))
	}
	return &NVML{lib: lib, checkSymbols: checkSymbols, registered: map[string]bool{}, eventFaults: map[string]Fault{},
		lastAddr: map[int]pci.Addr{}}, nil
}

// errString never calls into a library that might not be initialised:
// go-nvml's Return.Error() uses nvmlErrorString only once loaded.
func errString(r nvml.Return) string {
	switch r {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "NVML library not found (libnvidia-ml.so.1)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "NVIDIA driver is not running"
	case nvml.ERROR_NO_PERMISSION:
		return "insufficient permissions"
	case nvml.ERROR_NOT_SUPPORTED:
		return "not supported"
	case nvml.ERROR_NOT_FOUND:
		return "not found"
	case nvml.ERROR_INVALID_ARGUMENT:
		return "invalid argument"
	case nvml.ERROR_GPU_IS_LOST:
		return "GPU is lost"
	case nvml.ERROR_UNINITIALIZED:
		return "uninitialized"
	}
	return fmt.Sprintf("NVML error %d", int32(r))
}

func classifyRet(op string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	code := hosterr.Internal
	switch r {
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		code = hosterr.Unsupported
	case nvml.ERROR_NOT_FOUND:
		code = hosterr.NotFound
	case nvml.ERROR_INVALID_ARGUMENT:
		code = hosterr.Invalid
	case nvml.ERROR_NO_PERMISSION:
		code = hosterr.PermissionDenied
	case nvml.ERROR_IN_USE:
		code = hosterr.InUse
	case nvml.ERROR_INSUFFICIENT_RESOURCES, nvml.ERROR_INSUFFICIENT_SIZE:
		code = hosterr.NoCapacity
	case nvml.ERROR_UNINITIALIZED, nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		code = hosterr.NVMLUnavailable
	case nvml.ERROR_TIMEOUT:
		code = hosterr.Timeout
	}
	return hosterr.Errorf(code, op, "%s", errString(r))
}

// has reports whether an optional NVML symbol may be called.
func (n *NVML) has(symbol string) bool {
	if !n.checkSymbols {
		return true
	}
	return n.lib.Extensions().LookupSymbol(symbol) == nil
}

// Close shuts NVML down; later calls fail with NVMLUnavailable.
func (n *NVML) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		n.closed = true
		if n.events != nil {
			n.events.Free()
		}
		n.lib.Shutdown()
	}
}

func (n *NVML) open(op string) error {
	if n.closed {
		return hosterr.Errorf(hosterr.NVMLUnavailable, op, "NVML closed")
	}
	return nil
}

// GPUs reads every GPU. Queries a GPU does not support leave zero fields and
// are named in GPU.Unavailable; a GPU that cannot be opened at all is an error.
func (n *NVML) GPUs(ctx context.Context) ([]GPU, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.open("list gpus"); err != nil {
		return nil, err
	}
	driver, _ := n.lib.SystemGetDriverVersion()
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, classifyRet("nvml device count", ret)
	}
	n.openEvents()
	out := make([]GPU, 0, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dev, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_GPU_IS_LOST {
			if a, ok := n.lastAddr[i]; ok {
				out = append(out, lostGPU(i, a, driver))
				continue
			}
		}
		if ret != nvml.SUCCESS {
			return nil, classifyRet(fmt.Sprintf("nvml device %d", i), ret)
		}
		g, err := n.readGPU(i, dev)
		if err != nil {
			return nil, err
		}
		g.DriverVersion = driver
		if g.Fault == nil || g.Fault.Source != FaultLost {
			n.register(dev, g.UUID)
		}
		out = append(out, g)
	}
	n.drainEvents()
	for i := range out {
		if f, ok := n.eventFaults[out[i].UUID]; ok && out[i].UUID != "" && (out[i].Fault == nil || out[i].Fault.Source != FaultLost) {
			out[i].Fault = &f
		}
	}
	return out, nil
}

// lostGPU is a GPU that NVML lost: only its address (from an earlier
// read) and the fault are known.
func lostGPU(i int, a pci.Addr, driver string) GPU {
	return GPU{Index: i, Addr: a, DriverVersion: driver, SupportedTypes: []VGPUType{}, CreatableTypes: []VGPUType{},
		Active: []VGPUInstance{}, Unavailable: []string{"device: GPU is lost"},
		Fault: &Fault{Source: FaultLost, Reason: "GPU is lost: NVML no longer reaches it (fallen off the bus)"}}
}

// openEvents creates the event set once; a driver without one (or that
// refuses it) leaves the counters as the only fault source.
func (n *NVML) openEvents() {
	if n.events != nil || n.eventsErr != "" {
		return
	}
	if !n.has("nvmlEventSetCreate") {
		n.eventsErr = "no nvmlEventSetCreate"
		return
	}
	set, r := n.lib.EventSetCreate()
	if r != nvml.SUCCESS {
		n.eventsErr = errString(r)
		return
	}
	n.events = set
}

// register asks for a GPU's fault events (those of faultEvents it
// supports), once per GPU.
func (n *NVML) register(dev nvml.Device, uuid string) {
	if n.events == nil || uuid == "" || n.registered[uuid] {
		return
	}
	sup, r := dev.GetSupportedEventTypes()
	if r != nvml.SUCCESS {
		return
	}
	if mask := sup & faultEvents; mask != 0 && dev.RegisterEvents(mask, n.events) == nvml.SUCCESS {
		n.registered[uuid] = true
	}
}

// drainEvents reads the events waiting (without blocking) and keeps the
// first fault each GPU's events tell.
func (n *NVML) drainEvents() {
	if n.events == nil {
		return
	}
	for range 1024 {
		ev, r := n.events.Wait(0)
		if r != nvml.SUCCESS {
			return
		}
		f, ok := eventFault(ev)
		if !ok || ev.Device == nil {
			continue
		}
		uuid, r := ev.Device.GetUUID()
		if r != nvml.SUCCESS || uuid == "" {
			continue
		}
		if _, had := n.eventFaults[uuid]; !had {
			n.eventFaults[uuid] = f
		}
	}
}

// counterFault reads the counters that mark a GPU faulted: uncorrectable
// ECC errors since the driver loaded, a row remap failed or pending, pages
// pending retirement. Counters a GPU does not have are skipped.
func (n *NVML) counterFault(dev nvml.Device) *Fault {
	if c, r := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); r == nvml.SUCCESS && c > 0 {
		return &Fault{Source: FaultECC, Reason: fmt.Sprintf("%d uncorrectable ECC error(s) since the driver loaded", c)}
	}
	remapper := false
	if n.has("nvmlDeviceGetRemappedRows") {
		if _, _, pending, failed, r := dev.GetRemappedRows(); r == nvml.SUCCESS {
			remapper = true
			switch {
			case failed:
				return &Fault{Source: FaultRowRemap, Reason: "row remapping failed"}
			case pending:
				return &Fault{Source: FaultRowRemap, Reason: "row remap pending: the GPU needs a reset"}
			}
		}
	}
	if !remapper {
		if st, r := dev.GetRetiredPagesPendingStatus(); r == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
			return &Fault{Source: FaultRetiredPages, Reason: "retired pages pending: the GPU needs a reset"}
		}
	}
	return nil
}

func cstr(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

func (n *NVML) readGPU(i int, dev nvml.Device) (GPU, error) {
	g := GPU{Index: i, SupportedTypes: []VGPUType{}, CreatableTypes: []VGPUType{}, Active: []VGPUInstance{}}
	miss := func(what string, r nvml.Return) bool {
		if r == nvml.SUCCESS {
			return false
		}
		g.Unavailable = append(g.Unavailable, what+": "+errString(r))
		return true
	}
	pi, ret := dev.GetPciInfo()
	if a, ok := n.lastAddr[i]; ok && ret == nvml.ERROR_GPU_IS_LOST {
		return lostGPU(i, a, ""), nil
	}
	if ret != nvml.SUCCESS {
		return g, classifyRet(fmt.Sprintf("nvml device %d pci info", i), ret)
	}
	a, err := pci.Parse(cstr(pi.BusId[:]))
	if err != nil {
		return g, hosterr.New(hosterr.Internal, fmt.Sprintf("nvml device %d", i), err)
	}
	g.Addr = a
	n.lastAddr[i] = a
	var r nvml.Return
	if g.Name, r = dev.GetName(); miss("name", r) {
		g.Name = ""
	}
	if g.UUID, r = dev.GetUUID(); miss("uuid", r) {
		g.UUID = ""
	}
	if vm, r := dev.GetVirtualizationMode(); !miss("virtualization_mode", r) {
		g.VirtualizationMode = virtModeName(vm)
	}
	if n.has("nvmlDeviceGetHostVgpuMode") {
		if hm, r := dev.GetHostVgpuMode(); !miss("host_vgpu_mode", r) {
			g.HostVGPUMode = map[nvml.HostVgpuMode]string{nvml.HOST_VGPU_MODE_NON_SRIOV: "non_sriov", nvml.HOST_VGPU_MODE_SRIOV: "sriov"}[hm]
		}
	}
	if n.has("nvmlDeviceGetVgpuHeterogeneousMode") {
		if hm, r := dev.GetVgpuHeterogeneousMode(); !miss("heterogeneous_mode", r) {
			b := hm.Mode != 0
			g.Heterogeneous = &b
		}
	}
	typeNames := map[uint32]string{}
	if ts, r := dev.GetSupportedVgpus(); !miss("supported_vgpus", r) {
		for _, t := range ts {
			vt := readType(dev, t)
			typeNames[vt.ID] = vt.Name
			g.SupportedTypes = append(g.SupportedTypes, vt)
		}
	}
	if ts, r := dev.GetCreatableVgpus(); !miss("creatable_vgpus", r) {
		for _, t := range ts {
			g.CreatableTypes = append(g.CreatableTypes, readType(dev, t))
		}
	}
	utilByInstance := map[uint32][3]uint32{} // SM, encoder, decoder
	if vt, samples, r := dev.GetVgpuUtilization(0); r == nvml.SUCCESS {
		for _, s := range samples {
			utilByInstance[s.VgpuInstance] = [3]uint32{sampleValue(vt, s.SmUtil), sampleValue(vt, s.EncUtil), sampleValue(vt, s.DecUtil)}
		}
	}
	if insts, r := dev.GetActiveVgpus(); !miss("active_vgpus", r) {
		for _, in := range insts {
			vi := readInstance(in)
			if vi.TypeName == "" {
				vi.TypeName = typeNames[vi.TypeID]
			}
			if id, ok := instanceID(in); ok {
				u := utilByInstance[id]
				vi.UtilizationPct, vi.EncoderPct, vi.DecoderPct = u[0], u[1], u[2]
			}
			if vi.Licensed != nil && !*vi.Licensed {
				g.License.Unlicensed++
			}
			g.Active = append(g.Active, vi)
		}
	}
	if u, r := dev.GetUtilizationRates(); !miss("utilization", r) {
		g.Utilization = Util{GPU: u.Gpu, Memory: u.Memory}
	}
	if u, _, r := dev.GetEncoderUtilization(); r == nvml.SUCCESS {
		g.Utilization.Encoder = u
	}
	if u, _, r := dev.GetDecoderUtilization(); r == nvml.SUCCESS {
		g.Utilization.Decoder = u
	}
	if m, r := dev.GetMemoryInfo(); !miss("memory", r) {
		g.Memory = Memory{Total: m.Total, Used: m.Used, Free: m.Free}
	}
	if t, r := dev.GetTemperature(nvml.TEMPERATURE_GPU); !miss("temperature", r) {
		g.TemperatureC = t
	}
	if p, r := dev.GetPowerUsage(); !miss("power", r) {
		g.PowerMW = p
	}
	if c, r := dev.GetClockInfo(nvml.CLOCK_SM); !miss("clock_sm", r) {
		g.Clocks.SM = c
	}
	if c, r := dev.GetClockInfo(nvml.CLOCK_MEM); !miss("clock_mem", r) {
		g.Clocks.Mem = c
	}
	if c, r := dev.GetApplicationsClock(nvml.CLOCK_SM); r == nvml.SUCCESS {
		g.Clocks.AppSM = c
	}
	if c, r := dev.GetApplicationsClock(nvml.CLOCK_MEM); r == nvml.SUCCESS {
		g.Clocks.AppMem = c
	}
	if !n.has("nvmlDeviceGetVgpuSchedulerState") {
		// drivers before R525
	} else if s, r := readScheduler(dev); r == nvml.SUCCESS {
		g.Scheduler = &s
	}
	if lf, r := dev.GetGridLicensableFeatures(); r == nvml.SUCCESS {
		g.License.Supported = lf.IsGridLicenseSupported != 0
	}
	g.Fault = n.counterFault(dev)
	for _, u := range g.Unavailable {
		if strings.Contains(u, errString(nvml.ERROR_GPU_IS_LOST)) {
			g.Fault = &Fault{Source: FaultLost, Reason: "GPU is lost: NVML no longer reaches it (fallen off the bus)"}
		}
	}
	return g, nil
}

func readType(dev nvml.Device, t nvml.VgpuTypeId) VGPUType {
	vt := VGPUType{ID: t.GetID()}
	vt.Name, _ = t.GetName()
	vt.Class, _ = t.GetClass()
	if fb, r := t.GetFramebufferSize(); r == nvml.SUCCESS {
		vt.FramebufferMB = fb >> 20
	}
	vt.MaxInstances, _ = t.GetMaxInstances(dev)
	return vt
}

func readInstance(in nvml.VgpuInstance) VGPUInstance {
	var vi VGPUInstance
	vi.MdevUUID, _ = in.GetMdevUUID()
	vi.UUID, _ = in.GetUUID()
	vi.VMID, _, _ = in.GetVmID()
	if t, r := in.GetType(); r == nvml.SUCCESS && t != nil {
		vi.TypeID = t.GetID()
		vi.TypeName, _ = t.GetName()
	}
	vi.FBUsageBytes, _ = in.GetFbUsage()
	if v, r := in.GetVmDriverVersion(); r == nvml.SUCCESS && v != "Not Available" {
		vi.GuestDriverVersion = v
	}
	if li, r := in.GetLicenseInfo(); r == nvml.SUCCESS {
		b := li.IsLicensed != 0
		vi.Licensed = &b
	}
	return vi
}

// instanceID recovers the NVML instance handle (an unsigned integer in the
// real library) to match utilisation samples; mocks implement ID().
func instanceID(in nvml.VgpuInstance) (uint32, bool) {
	if x, ok := in.(interface{ ID() uint32 }); ok {
		return x.ID(), true
	}
	v := reflect.ValueOf(in)
	switch v.Kind() {
	case reflect.Uint32, reflect.Uint, reflect.Uint64:
		u := v.Uint()
		if u <= math.MaxUint32 {
			return uint32(u), true
		}
	}
	return 0, false
}

func sampleValue(t nvml.ValueType, b [8]byte) uint32 {
	switch t {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return binary.LittleEndian.Uint32(b[:4])
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return uint32(binary.LittleEndian.Uint64(b[:]))
	case nvml.VALUE_TYPE_DOUBLE:
		return uint32(math.Float64frombits(binary.LittleEndian.Uint64(b[:])))
	}
	return 0
}

func virtModeName(m nvml.GpuVirtualizationMode) string {
	switch m {
	case nvml.GPU_VIRTUALIZATION_MODE_NONE:
		return "none"
	case nvml.GPU_VIRTUALIZATION_MODE_PASSTHROUGH:
		return "passthrough"
	case nvml.GPU_VIRTUALIZATION_MODE_VGPU:
		return "vgpu"
	case nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU:
		return "host_vgpu"
	case nvml.GPU_VIRTUALIZATION_MODE_HOST_VSGA:
		return "host_vsga"
	}
	return fmt.Sprintf("mode_%d", m)
}

func policyName(p uint32) string {
	switch p {
	case nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT:
		return PolicyBestEffort
	case nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE:
		return PolicyEqualShare
	case nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE:
		return PolicyFixedShare
	}
	return "unknown"
}

// PolicyValue maps a policy name to NVML's value; ok false for unknown names.
func PolicyValue(name string) (uint32, bool) {
	switch name {
	case PolicyBestEffort:
		return nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT, true
	case PolicyEqualShare:
		return nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, true
	case PolicyFixedShare:
		return nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, true
	}
	return 0, false
}

func (n *NVML) device(op string, a pci.Addr) (nvml.Device, error) {
	if err := n.open(op); err != nil {
		return nil, err
	}
	dev, ret := n.lib.DeviceGetHandleByPciBusId(a.NVML())
	if ret != nvml.SUCCESS {
		return nil, classifyRet(op, ret)
	}
	return dev, nil
}

// nsPerUs converts the protocol's µs to NVML's timeslice unit, ns.
const nsPerUs = 1000

// readScheduler reads a GPU's vGPU scheduler state (timeslice in µs).
func readScheduler(dev nvml.Device) (Scheduler, nvml.Return) {
	s, r := dev.GetVgpuSchedulerState()
	if r != nvml.SUCCESS {
		return Scheduler{}, r
	}
	return Scheduler{Policy: policyName(s.SchedulerPolicy), TimesliceUs: binary.LittleEndian.Uint32(s.SchedulerParams[:4]) / nsPerUs}, r
}

// SetVGPUScheduler sets the vGPU scheduler policy (and timeslice) of a
// GPU, reads the state back and returns it. NVML takes the timeslice in
// ns; the protocol's µs are converted. The driver's capabilities bound
// the timeslice (nvmlDeviceGetVgpuSchedulerCapabilities), and the driver
// changes the scheduler only while no VM runs on the GPU.
func (n *NVML) SetVGPUScheduler(ctx context.Context, a pci.Addr, policy string, timesliceUs uint32) (Applied, error) {
	op := fmt.Sprintf("set vgpu scheduler %s/%dus on %s", policy, timesliceUs, a)
	if err := ctx.Err(); err != nil {
		return Applied{}, err
	}
	p, ok := PolicyValue(policy)
	if !ok {
		return Applied{}, hosterr.Errorf(hosterr.Invalid, op, "policy must be %s, %s or %s", PolicyBestEffort, PolicyEqualShare, PolicyFixedShare)
	}
	if p == nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT && timesliceUs != 0 {
		return Applied{}, hosterr.Errorf(hosterr.Invalid, op, "best_effort has no timeslice (give 0)")
	}
	if uint64(timesliceUs)*nsPerUs > math.MaxUint32 {
		return Applied{}, hosterr.Errorf(hosterr.Invalid, op, "timeslice %d µs is too long for NVML", timesliceUs)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	dev, err := n.device(op, a)
	if err != nil {
		return Applied{}, err
	}
	if !n.has("nvmlDeviceSetVgpuSchedulerState") || !n.has("nvmlDeviceGetVgpuSchedulerState") {
		return Applied{}, hosterr.Errorf(hosterr.Unsupported, op, "the NVIDIA driver has no vGPU scheduler control (R525 or newer needed)")
	}
	if n.has("nvmlDeviceGetVgpuSchedulerCapabilities") {
		if c, r := dev.GetVgpuSchedulerCapabilities(); r == nvml.SUCCESS {
			if !slices.Contains(c.SupportedSchedulers[:], p) {
				return Applied{}, hosterr.Errorf(hosterr.Unsupported, op, "the GPU's driver does not offer the %s scheduler", policy)
			}
			ns := timesliceUs * nsPerUs
			if ns != 0 && c.MaxTimeslice > 0 && (ns < c.MinTimeslice || ns > c.MaxTimeslice) {
				return Applied{}, hosterr.Errorf(hosterr.Invalid, op, "timeslice %d µs is outside the driver's range %d–%d µs",
					timesliceUs, c.MinTimeslice/nsPerUs, c.MaxTimeslice/nsPerUs)
			}
		}
	}
	// Asking for the state the GPU has already is a success without a
	// change, so that tuning after every change is idempotent (the driver
	// would refuse it while a VM runs).
	want := func(s Scheduler) bool {
		return s.Policy == policy && (timesliceUs == 0 || s.TimesliceUs == timesliceUs)
	}
	cur, r := readScheduler(dev)
	if r == nvml.SUCCESS && want(cur) {
		return Applied{Scheduler: &cur}, nil
	}
	st := nvml.VgpuSchedulerSetState{SchedulerPolicy: p, EnableARRMode: nvml.VGPU_SCHEDULER_ARR_DEFAULT}
	binary.LittleEndian.PutUint32(st.SchedulerParams[:4], timesliceUs*nsPerUs)
	if err := classifyRet(op, dev.SetVgpuSchedulerState(&st)); hosterr.Is(err, hosterr.InUse) {
		return Applied{}, hosterr.Errorf(hosterr.InUse, op, "a VM runs on the GPU, and NVIDIA's driver changes the vGPU scheduler only while none does; "+
			"the GPU keeps its scheduler %s", orUnknown(cur.Policy))
	} else if err != nil {
		return Applied{}, err
	}
	got, r := readScheduler(dev)
	if r != nvml.SUCCESS {
		return Applied{}, classifyRet(op+": read the scheduler back", r)
	}
	if !want(got) {
		return Applied{}, hosterr.Errorf(hosterr.Internal, op, "NVML accepted the change but reads back %s/%dus", got.Policy, got.TimesliceUs)
	}
	return Applied{Changed: true, Scheduler: &got}, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// readAppClocks reads a GPU's application clocks.
func readAppClocks(dev nvml.Device) (memMHz, smMHz uint32, r nvml.Return) {
	if memMHz, r = dev.GetApplicationsClock(nvml.CLOCK_MEM); r != nvml.SUCCESS {
		return 0, 0, r
	}
	smMHz, r = dev.GetApplicationsClock(nvml.CLOCK_SM)
	return memMHz, smMHz, r
}

// SetApplicationClocks sets a GPU's application clocks, reads them back
// and returns them. NVML takes only the pairs the GPU supports (nvidia-smi
// -q -d SUPPORTED_CLOCKS lists them) and refuses others.
func (n *NVML) SetApplicationClocks(ctx context.Context, a pci.Addr, memMHz, smMHz uint32) (Applied, error) {
	op := fmt.Sprintf("set application clocks mem=%d sm=%d on %s", memMHz, smMHz, a)
	if err := ctx.Err(); err != nil {
		return Applied{}, err
	}
	if smMHz == 0 {
		return Applied{}, hosterr.Errorf(hosterr.Invalid, op, "the SM clock is required")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	dev, err := n.device(op, a)
	if err != nil {
		return Applied{}, err
	}
	curMem, curSM, r := readAppClocks(dev)
	if r != nvml.SUCCESS {
		return Applied{}, classifyRet(op+": read the application clocks", r)
	}
	if memMHz == 0 {
		// Only the SM clock asked for: the memory clock stays as it is.
		memMHz = curMem
	}
	if curMem == memMHz && curSM == smMHz {
		return Applied{AppMemMHz: curMem, AppSMMHz: curSM}, nil
	}
	if err := classifyRet(op, dev.SetApplicationsClocks(memMHz, smMHz)); hosterr.Is(err, hosterr.Invalid) {
		return Applied{}, hosterr.Errorf(hosterr.Invalid, op, "NVML refused memory %d MHz with SM %d MHz: not an application clock pair the GPU supports "+
			"(nvidia-smi -q -d SUPPORTED_CLOCKS lists them); the GPU keeps %d/%d MHz", memMHz, smMHz, curMem, curSM)
	} else if err != nil {
		return Applied{}, err
	}
	gotMem, gotSM, r := readAppClocks(dev)
	if r != nvml.SUCCESS {
		return Applied{}, classifyRet(op+": read the clocks back", r)
	}
	if gotMem != memMHz || gotSM != smMHz {
		return Applied{}, hosterr.Errorf(hosterr.Internal, op, "NVML accepted the clocks but reads back memory %d MHz, SM %d MHz", gotMem, gotSM)
	}
	return Applied{Changed: true, AppMemMHz: gotMem, AppSMMHz: gotSM}, nil
}

// ResetApplicationClocks restores a GPU's default application clocks and
// returns them as read back.
func (n *NVML) ResetApplicationClocks(ctx context.Context, a pci.Addr) (Applied, error) {
	op := "reset application clocks on " + a.String()
	if err := ctx.Err(); err != nil {
		return Applied{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	dev, err := n.device(op, a)
	if err != nil {
		return Applied{}, err
	}
	if err := classifyRet(op, dev.ResetApplicationsClocks()); err != nil {
		return Applied{}, err
	}
	mem, sm, r := readAppClocks(dev)
	if r != nvml.SUCCESS {
		return Applied{}, classifyRet(op+": read the clocks back", r)
	}
	return Applied{Changed: true, AppMemMHz: mem, AppSMMHz: sm}, nil
}
