package gpu

import (
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// MockGPU describes one GPU of a mock NVML.
type MockGPU struct {
	Name        string // "Tesla T4"
	UUID        string // "GPU-…"
	Addr        pci.Addr
	MemoryMB    uint64
	PciDeviceID uint32 // 0x1eb810de
	// HostVGPUMode is "non_sriov" (mdev) or "sriov" (vendor VFIO).
	HostVGPUMode  string
	Heterogeneous bool
	Types         []VGPUType
	UtilGPU       uint32
	UtilMem       uint32
	TempC         uint32
	PowerMW       uint32
	SMClockMHz    uint32
	MemClockMHz   uint32
	// Active returns the running vGPUs at the time of the call (a fake host
	// derives them from its sysfs tree); nil means none.
	Active func() []MockVGPU
	// Creatable returns the type ids creatable now; nil means all types.
	Creatable func() []uint32
	// RowRemapper: the GPU remaps rows (Ampere and newer); the older ones
	// retire pages instead.
	RowRemapper bool
}

// MockVGPU is a running vGPU of a mock GPU.
type MockVGPU struct {
	MdevUUID     string
	VMID         string
	TypeID       uint32
	FBUsageBytes uint64
	Licensed     bool
	UtilPct      uint32
	EncPct       uint32 // video encoder utilisation
	DecPct       uint32 // video decoder utilisation
	GuestDriver  string // "" → "Not Available", as NVML says before the guest driver loads
}

// Mock is go-nvml's mock server (mock/server) with the functions it leaves
// nil filled in from MockGPUs: vGPU types and instances, utilisation,
// temperature, power, clocks, scheduler, licence, and lookup by the PCI bus
// id. It records what the agent set.
type Mock struct {
	*server.Server
	gpus []MockGPU

	mu        sync.Mutex
	sched     map[pci.Addr]nvml.VgpuSchedulerSetState
	appClocks map[pci.Addr][2]uint32 // mem, sm
	health    map[pci.Addr]*mockHealth
	events    chan nvml.EventData // the one event set's queue
}

// mockHealth is a mock GPU's fault state: its counters, whether it is
// lost, and the events it is registered for.
type mockHealth struct {
	eccUncorrected uint64
	remapPending   bool
	remapFailed    bool
	retiredPending bool
	lost           bool
	registered     uint64
}

func (m *Mock) gpuHealth(a pci.Addr) *mockHealth {
	h := m.health[a]
	if h == nil {
		h = &mockHealth{}
		m.health[a] = h
	}
	return h
}

func (m *Mock) device(a pci.Addr) nvml.Device {
	for i, g := range m.gpus {
		if g.Addr == a {
			return m.Devices[i]
		}
	}
	return nil
}

// post queues an event of a GPU, as the driver does: only when the GPU is
// registered for its type on the event set. It reports whether it did.
func (m *Mock) post(a pci.Addr, typ, data uint64) bool {
	m.mu.Lock()
	reg := m.gpuHealth(a).registered
	m.mu.Unlock()
	d := m.device(a)
	if d == nil || reg&typ == 0 {
		return false
	}
	select {
	case m.events <- nvml.EventData{Device: d, EventType: typ, EventData: data}:
		return true
	default:
		return false // the driver's queue is full: the event is lost
	}
}

// InjectXid delivers Xid x on a GPU's event stream (as the driver's
// critical Xid event). It reports whether the GPU's events are watched.
func (m *Mock) InjectXid(a pci.Addr, x uint64) bool {
	return m.post(a, nvml.EventTypeXidCriticalError, x)
}

// InjectECC counts n uncorrectable (double bit) ECC errors on a GPU and
// delivers the double bit ECC event.
func (m *Mock) InjectECC(a pci.Addr, n uint64) bool {
	m.mu.Lock()
	m.gpuHealth(a).eccUncorrected += n
	m.mu.Unlock()
	return m.post(a, nvml.EventTypeDoubleBitEccError, 0)
}

// SetRemapPending sets a GPU's pending row remap (failed: the remap failed).
func (m *Mock) SetRemapPending(a pci.Addr, pending, failed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.gpuHealth(a)
	h.remapPending, h.remapFailed = pending, failed
}

// SetRetiredPagesPending sets a GPU's pages pending retirement.
func (m *Mock) SetRetiredPagesPending(a pci.Addr, pending bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpuHealth(a).retiredPending = pending
}

// SetLost makes a GPU lost (NVML answers GPU_IS_LOST for it) or back.
func (m *Mock) SetLost(a pci.Addr, lost bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpuHealth(a).lost = lost
}

// ResetGPU is a GPU reset: the volatile counters and pending states clear.
func (m *Mock) ResetGPU(a pci.Addr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.gpuHealth(a)
	h.eccUncorrected, h.remapPending, h.remapFailed, h.retiredPending, h.lost = 0, false, false, false, false
}

func (m *Mock) isLost(a pci.Addr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gpuHealth(a).lost
}

// Scheduler returns the scheduler state last set on a GPU.
func (m *Mock) Scheduler(a pci.Addr) (policy string, timesliceUs uint32, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sched[a]
	return policyName(s.SchedulerPolicy), binary.LittleEndian.Uint32(s.SchedulerParams[:4]) / nsPerUs, ok
}

// The mock driver's vGPU scheduler timeslice range and default, in ns
// (NVML's unit), as NVIDIA documents for the equal and fixed share
// schedulers: 1 to 30 ms.
const (
	MockMinTimesliceNs     = 1_000_000
	MockMaxTimesliceNs     = 30_000_000
	mockDefaultTimesliceNs = 2_000_000
)

// MockClockStepMHz is the step of the SM application clocks a mock GPU
// supports: from MockMinSMClockMHz up to its SMClockMHz, with its
// MemClockMHz as the one memory clock (a T4 offers 300–1590 MHz in 15 MHz
// steps at 5001 MHz).
const (
	MockClockStepMHz  = 15
	MockMinSMClockMHz = 300
)

// mockClockSupported reports whether mem/sm is an application clock pair
// g supports.
func mockClockSupported(g *MockGPU, mem, sm uint32) bool {
	return mem == g.MemClockMHz && sm >= MockMinSMClockMHz && sm <= g.SMClockMHz &&
		((sm-MockMinSMClockMHz)%MockClockStepMHz == 0 || sm == g.SMClockMHz)
}

// AppClocks returns the application clocks set on a GPU (0, 0 when default).
func (m *Mock) AppClocks(a pci.Addr) (memMHz, smMHz uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.appClocks[a]
	return c[0], c[1]
}

// NewMock builds a mock NVML of the given GPUs.
func NewMock(driverVersion string, list []MockGPU) *Mock {
	cfgs := make([]gpus.Config, len(list))
	for i, g := range list {
		cfgs[i] = gpus.Config{Name: g.Name, MemoryMB: g.MemoryMB, PciDeviceId: g.PciDeviceID, Architecture: nvml.DEVICE_ARCH_TURING}
	}
	s, _ := server.New(server.WithGPUs(cfgs...), server.WithDriverVersion(driverVersion))
	m := &Mock{Server: s, gpus: list, sched: map[pci.Addr]nvml.VgpuSchedulerSetState{}, appClocks: map[pci.Addr][2]uint32{},
		health: map[pci.Addr]*mockHealth{}, events: make(chan nvml.EventData, 256)}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				if ms == 0 {
					select {
					case ev := <-m.events:
						return ev, nvml.SUCCESS
					default:
						return nvml.EventData{}, nvml.ERROR_TIMEOUT
					}
				}
				t := time.NewTimer(time.Duration(ms) * time.Millisecond)
				defer t.Stop()
				select {
				case ev := <-m.events:
					return ev, nvml.SUCCESS
				case <-t.C:
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	s.DeviceGetHandleByPciBusIdFunc = func(busID string) (nvml.Device, nvml.Return) {
		a, err := pci.Parse(busID)
		if err != nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		for i, g := range list {
			if g.Addr == a {
				return s.Devices[i], nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	for i := range list {
		d := s.Devices[i].(*server.Device)
		m.fill(d, &m.gpus[i])
	}
	return m
}

func busID(a pci.Addr) [32]int8 {
	var b [32]int8
	for i, c := range []byte(a.NVML()) {
		b[i] = int8(c)
	}
	return b
}

type mockInstance struct {
	*mock.VgpuInstance
	id uint32
}

func (m mockInstance) ID() uint32 { return m.id }

func (m *Mock) fill(d *server.Device, g *MockGPU) {
	if g.UUID != "" {
		d.UUID = g.UUID
	}
	d.PciBusID = g.Addr.NVML()
	types := map[uint32]*mock.VgpuTypeId{}
	typeList := make([]nvml.VgpuTypeId, 0, len(g.Types))
	for _, t := range g.Types {
		t := t
		mt := &mock.VgpuTypeId{
			GetIDFunc:              func() uint32 { return t.ID },
			GetNameFunc:            func() (string, nvml.Return) { return t.Name, nvml.SUCCESS },
			GetClassFunc:           func() (string, nvml.Return) { return t.Class, nvml.SUCCESS },
			GetFramebufferSizeFunc: func() (uint64, nvml.Return) { return t.FramebufferMB << 20, nvml.SUCCESS },
			GetMaxInstancesFunc:    func(nvml.Device) (int, nvml.Return) { return t.MaxInstances, nvml.SUCCESS },
		}
		types[t.ID] = mt
		typeList = append(typeList, mt)
	}
	active := func() []MockVGPU {
		if g.Active == nil {
			return nil
		}
		return g.Active()
	}
	fbUsed := func() uint64 {
		var used uint64
		for _, v := range active() {
			for _, t := range g.Types {
				if t.ID == v.TypeID {
					used += t.FramebufferMB << 20
				}
			}
		}
		return min(used, g.MemoryMB<<20)
	}
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		if m.isLost(g.Addr) {
			return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST
		}
		return nvml.PciInfo{Domain: uint32(g.Addr.Domain), Bus: uint32(g.Addr.Bus), Device: uint32(g.Addr.Slot),
			PciDeviceId: g.PciDeviceID, BusId: busID(g.Addr)}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		u := fbUsed()
		return nvml.Memory{Total: g.MemoryMB << 20, Used: u, Free: g.MemoryMB<<20 - u}, nvml.SUCCESS
	}
	d.GetVirtualizationModeFunc = func() (nvml.GpuVirtualizationMode, nvml.Return) {
		return nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU, nvml.SUCCESS
	}
	d.GetHostVgpuModeFunc = func() (nvml.HostVgpuMode, nvml.Return) {
		if g.HostVGPUMode == "sriov" {
			return nvml.HOST_VGPU_MODE_SRIOV, nvml.SUCCESS
		}
		return nvml.HOST_VGPU_MODE_NON_SRIOV, nvml.SUCCESS
	}
	d.GetVgpuHeterogeneousModeFunc = func() (nvml.VgpuHeterogeneousMode, nvml.Return) {
		var mode uint32
		if g.Heterogeneous {
			mode = 1
		}
		return nvml.VgpuHeterogeneousMode{Version: 1, Mode: mode}, nvml.SUCCESS
	}
	d.GetSupportedVgpusFunc = func() ([]nvml.VgpuTypeId, nvml.Return) { return typeList, nvml.SUCCESS }
	d.GetCreatableVgpusFunc = func() ([]nvml.VgpuTypeId, nvml.Return) {
		if g.Creatable == nil {
			return typeList, nvml.SUCCESS
		}
		var out []nvml.VgpuTypeId
		for _, id := range g.Creatable() {
			if t, ok := types[id]; ok {
				out = append(out, t)
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetActiveVgpusFunc = func() ([]nvml.VgpuInstance, nvml.Return) {
		var out []nvml.VgpuInstance
		for i, v := range active() {
			v := v
			t := types[v.TypeID]
			mi := &mock.VgpuInstance{
				GetMdevUUIDFunc: func() (string, nvml.Return) { return v.MdevUUID, nvml.SUCCESS },
				GetUUIDFunc:     func() (string, nvml.Return) { return v.MdevUUID, nvml.SUCCESS },
				GetVmIDFunc: func() (string, nvml.VgpuVmIdType, nvml.Return) {
					return v.VMID, nvml.VGPU_VM_ID_UUID, nvml.SUCCESS
				},
				GetTypeFunc: func() (nvml.VgpuTypeId, nvml.Return) {
					if t == nil {
						return nil, nvml.ERROR_NOT_FOUND
					}
					return t, nvml.SUCCESS
				},
				GetFbUsageFunc: func() (uint64, nvml.Return) { return v.FBUsageBytes, nvml.SUCCESS },
				GetVmDriverVersionFunc: func() (string, nvml.Return) {
					if v.GuestDriver == "" {
						return "Not Available", nvml.SUCCESS
					}
					return v.GuestDriver, nvml.SUCCESS
				},
				GetLicenseInfoFunc: func() (nvml.VgpuLicenseInfo, nvml.Return) {
					var l uint8
					if v.Licensed {
						l = 1
					}
					return nvml.VgpuLicenseInfo{IsLicensed: l}, nvml.SUCCESS
				},
			}
			out = append(out, mockInstance{mi, uint32(i + 1)})
		}
		return out, nvml.SUCCESS
	}
	d.GetVgpuUtilizationFunc = func(uint64) (nvml.ValueType, []nvml.VgpuInstanceUtilizationSample, nvml.Return) {
		var out []nvml.VgpuInstanceUtilizationSample
		for i, v := range active() {
			s := nvml.VgpuInstanceUtilizationSample{VgpuInstance: uint32(i + 1)}
			binary.LittleEndian.PutUint32(s.SmUtil[:4], v.UtilPct)
			binary.LittleEndian.PutUint32(s.EncUtil[:4], v.EncPct)
			binary.LittleEndian.PutUint32(s.DecUtil[:4], v.DecPct)
			out = append(out, s)
		}
		return nvml.VALUE_TYPE_UNSIGNED_INT, out, nvml.SUCCESS
	}
	// The engines are shared: the busiest vGPU's share stands for the GPU.
	codec := func(pick func(MockVGPU) uint32) (uint32, uint32, nvml.Return) {
		var hi uint32
		for _, v := range active() {
			hi = max(hi, pick(v))
		}
		return hi, 167000, nvml.SUCCESS // NVML's sampling period, µs
	}
	d.GetEncoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return codec(func(v MockVGPU) uint32 { return v.EncPct }) }
	d.GetDecoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return codec(func(v MockVGPU) uint32 { return v.DecPct }) }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{Gpu: g.UtilGPU, Memory: g.UtilMem}, nvml.SUCCESS
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return g.TempC, nvml.SUCCESS }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return g.PowerMW, nvml.SUCCESS }
	d.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		if c == nvml.CLOCK_MEM {
			return g.MemClockMHz, nvml.SUCCESS
		}
		return g.SMClockMHz, nvml.SUCCESS
	}
	d.GetApplicationsClockFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		ac, ok := m.appClocks[g.Addr]
		switch {
		case !ok && c == nvml.CLOCK_MEM:
			return g.MemClockMHz, nvml.SUCCESS
		case !ok:
			return g.SMClockMHz, nvml.SUCCESS
		case c == nvml.CLOCK_MEM:
			return ac[0], nvml.SUCCESS
		}
		return ac[1], nvml.SUCCESS
	}
	d.GetVgpuSchedulerCapabilitiesFunc = func() (nvml.VgpuSchedulerCapabilities, nvml.Return) {
		return nvml.VgpuSchedulerCapabilities{
			SupportedSchedulers: [3]uint32{nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT, nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE},
			MinTimeslice:        MockMinTimesliceNs, MaxTimeslice: MockMaxTimesliceNs,
		}, nvml.SUCCESS
	}
	d.GetVgpuSchedulerStateFunc = func() (nvml.VgpuSchedulerGetState, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		s, ok := m.sched[g.Addr]
		if !ok {
			return nvml.VgpuSchedulerGetState{SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT}, nvml.SUCCESS
		}
		out := nvml.VgpuSchedulerGetState{SchedulerPolicy: s.SchedulerPolicy, ArrMode: s.EnableARRMode}
		// The timeslice as configured, or the default; none for best effort.
		ts := binary.LittleEndian.Uint32(s.SchedulerParams[:4])
		if ts == 0 {
			ts = mockDefaultTimesliceNs
		}
		if s.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT {
			binary.LittleEndian.PutUint32(out.SchedulerParams[:4], ts)
		}
		return out, nvml.SUCCESS
	}
	d.SetVgpuSchedulerStateFunc = func(s *nvml.VgpuSchedulerSetState) nvml.Return {
		if s.SchedulerPolicy < nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT || s.SchedulerPolicy > nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if ts := binary.LittleEndian.Uint32(s.SchedulerParams[:4]); ts != 0 && (ts < MockMinTimesliceNs || ts > MockMaxTimesliceNs) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if len(active()) > 0 {
			// The driver changes the scheduler only while no VM runs.
			return nvml.ERROR_IN_USE
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.sched[g.Addr] = *s
		return nvml.SUCCESS
	}
	d.SetApplicationsClocksFunc = func(mem, sm uint32) nvml.Return {
		if !mockClockSupported(g, mem, sm) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.appClocks[g.Addr] = [2]uint32{mem, sm}
		return nvml.SUCCESS
	}
	d.ResetApplicationsClocksFunc = func() nvml.Return {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.appClocks, g.Addr)
		return nvml.SUCCESS
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError | nvml.EventTypePState |
			nvml.EventTypeXidCriticalError | nvml.EventTypeClock, nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(types uint64, _ nvml.EventSet) nvml.Return {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.gpuHealth(g.Addr).lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		m.gpuHealth(g.Addr).registered |= types
		return nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		h := m.gpuHealth(g.Addr)
		if h.lost {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return h.eccUncorrected, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		h := m.gpuHealth(g.Addr)
		switch {
		case h.lost:
			return 0, 0, false, false, nvml.ERROR_GPU_IS_LOST
		case !g.RowRemapper:
			return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
		}
		var unc int
		if h.remapPending || h.remapFailed {
			unc = 1
		}
		return 0, unc, h.remapPending, h.remapFailed, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.gpuHealth(g.Addr).retiredPending {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetGridLicensableFeaturesFunc = func() (nvml.GridLicensableFeatures, nvml.Return) {
		return nvml.GridLicensableFeatures{IsGridLicenseSupported: 1}, nvml.SUCCESS
	}
}

// NewMockBackend returns a Backend over a new Mock, and the Mock.
func NewMockBackend(driverVersion string, list []MockGPU) (*NVML, *Mock) {
	m := NewMock(driverVersion, list)
	n, err := Init(m, false)
	if err != nil {
		panic(err) // the mock's Init always succeeds
	}
	return n, m
}

// TypeIDs returns the ids of types, for MockGPU.Creatable.
func TypeIDs(types []VGPUType) []uint32 {
	out := make([]uint32, 0, len(types))
	for _, t := range types {
		out = append(out, t.ID)
	}
	slices.Sort(out)
	return out
}
