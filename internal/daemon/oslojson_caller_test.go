package daemon

import "runtime"

// callerPC is the program counter of its caller's call, for a record
// whose source the golden file shows (kept alone in this file so that
// the golden line number does not move when the tests change).
func callerPC() uintptr {
	var pcs [1]uintptr
	runtime.Callers(1, pcs[:])
	return pcs[0]
}
