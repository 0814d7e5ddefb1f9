package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Fault is why a GPU must take no new vGPU: a critical Xid NVML's event
// stream delivered, or a counter NVML reads (uncorrectable ECC errors,
// row remaps or retired pages pending, the GPU lost).
type Fault struct {
	// Source: "xid", "ecc", "row_remap", "retired_pages" or "gpu_lost".
	Source string `json:"source"`
	// Xid is the Xid number when Source is "xid".
	Xid uint64 `json:"xid,omitempty"`
	// Reason is for people: "Xid 79: GPU has fallen off the bus".
	Reason string `json:"reason"`
}

// Fault sources.
const (
	FaultXid          = "xid"
	FaultECC          = "ecc"
	FaultRowRemap     = "row_remap"
	FaultRetiredPages = "retired_pages"
	FaultLost         = "gpu_lost"
)

// faultEvents are the NVML event types the backend registers for.
const faultEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError

// xidFatal names the Xids after which a GPU must take no new vGPU
// (NVIDIA's Xid catalogue: the GPU or its memory needs a reset, or the
// driver lost the GPU). Other Xids (13, 31, 43: a guest's own fault) are
// the application's, not the GPU's.
var xidFatal = map[uint64]string{
	48:  "double bit ECC error",
	61:  "internal micro-controller breakpoint/warning",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapper recording failure",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
	140: "unrecovered ECC error",
}

// XidFatal reports whether Xid x marks a GPU faulted, with its meaning.
func XidFatal(x uint64) (string, bool) {
	s, ok := xidFatal[x]
	return s, ok
}

// XidFault is the fault of a fatal Xid.
func XidFault(x uint64) Fault {
	what, _ := XidFatal(x)
	return Fault{Source: FaultXid, Xid: x, Reason: fmt.Sprintf("Xid %d: %s", x, what)}
}

// eventFault is the fault an NVML event means; ok false for an event that
// is none (a non-fatal Xid).
func eventFault(ev nvml.EventData) (Fault, bool) {
	switch {
	case ev.EventType&nvml.EventTypeXidCriticalError != 0:
		if _, ok := XidFatal(ev.EventData); ok {
			return XidFault(ev.EventData), true
		}
	case ev.EventType&nvml.EventTypeDoubleBitEccError != 0:
		return Fault{Source: FaultECC, Reason: "double bit ECC error"}, true
	}
	return Fault{}, false
}
