package policy

import (
	"fmt"
	"reflect"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

// IntentKind names what a rule asks for.
type IntentKind string

// Intent kinds.
const (
	IntentAttach    IntentKind = "attach"     // attach(profile, count): give the instance vGPUs
	IntentRelease   IntentKind = "release"    // release() or release(profile): take them back
	IntentResize    IntentKind = "resize"     // resize(profile): move the instance's vGPUs to another profile
	IntentMove      IntentKind = "move"       // move(): move the instance's direct-path vGPUs off the event's GPU (bridge.GPU_FAULT), same profile
	IntentTune      IntentKind = "tune"       // tune(scheduler, timeslice_us, clocks_mhz): per physical GPU
	IntentSetLimits IntentKind = "set_limits" // set_limits(cpu_max, memory_high): cgroup v2 limits of the VM
	IntentNotify    IntentKind = "notify"     // notify(message)
	IntentReject    IntentKind = "reject"     // reject(reason)
)

// changes reports whether the intent changes an instance's vGPUs.
func (k IntentKind) changes() bool {
	return k == IntentAttach || k == IntentRelease || k == IntentResize || k == IntentMove
}

// Intent is one thing the bridge should do, with the reason.
type Intent struct {
	Kind     IntentKind `json:"kind"`
	Rule     string     `json:"rule"`
	Instance string     `json:"instance_uuid,omitempty"`
	Host     string     `json:"host,omitempty"`

	// attach, release, resize
	Profile string     `json:"profile,omitempty"`
	TypeID  string     `json:"type_id,omitempty"`
	Trait   string     `json:"trait,omitempty"`
	Count   int        `json:"count,omitempty"`
	Mode    AttachMode `json:"mode,omitempty"`
	// FrameRateLimit, when set, is the workload's frame-rate limiter
	// (on or off) for the vGPUs the bridge creates (direct path only).
	FrameRateLimit *bool `json:"frame_rate_limit,omitempty"`
	// ExcludedHosts are hosts whose vGPU manager cannot serve the guest's
	// driver; placement must not choose them.
	ExcludedHosts []Exclusion `json:"excluded_hosts,omitempty"`

	// tune: the GPUs to tune; move: the GPU (PCI address) to leave
	GPUs        []string `json:"gpus,omitempty"`
	Scheduler   string   `json:"scheduler,omitempty"`
	TimesliceUS int      `json:"timeslice_us,omitempty"`
	ClocksMHz   int      `json:"clocks_mhz,omitempty"`
	// Tenant marks a tune the event's sender asked for (event.tune), not
	// an operator rule: the bridge refuses it on a GPU that another
	// tenant's vGPU shares.
	Tenant bool `json:"tenant,omitempty"`

	// set_limits
	CPUMax     string `json:"cpu_max,omitempty"`
	MemoryHigh string `json:"memory_high,omitempty"`

	// notify text or reject reason
	Message string `json:"message,omitempty"`

	// Why is the explanation: the rule and the values that made it fire.
	Why string `json:"why"`
}

// Exclusion is a host left out, with the reason.
type Exclusion struct {
	Host   string `json:"host"`
	Reason string `json:"reason"`
}

// Refusal is an intent a rule produced that the policy did not allow.
type Refusal struct {
	Intent Intent `json:"intent"`
	Reason string `json:"reason"`
	// Code is RefusalQuota when the project's quota refused the intent.
	Code string `json:"code,omitempty"`
}

// RefusalQuota codes a refusal by the project's quota: the request ends
// rejected with code "quota".
const RefusalQuota = "quota"

// intentCELType is the CEL type of the intent functions' results.
var intentCELType = types.NewOpaqueType("policy.Intent")

// intentVal carries an Intent through CEL.
type intentVal struct{ in Intent }

var _ ref.Val = intentVal{}

func (v intentVal) ConvertToNative(t reflect.Type) (any, error) {
	if t == reflect.TypeOf(Intent{}) {
		return v.in, nil
	}
	return nil, fmt.Errorf("policy.Intent cannot become %v", t)
}

func (v intentVal) ConvertToType(t ref.Type) ref.Val {
	if t.TypeName() == intentCELType.TypeName() {
		return v
	}
	return types.NewErr("policy.Intent cannot become %s", t.TypeName())
}

func (v intentVal) Equal(o ref.Val) ref.Val {
	w, ok := o.(intentVal)
	return types.Bool(ok && reflect.DeepEqual(v.in, w.in))
}

func (v intentVal) Type() ref.Type { return intentCELType }
func (v intentVal) Value() any     { return v.in }
