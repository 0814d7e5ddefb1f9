package testsvc

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Patience is how many times longer than a test's own figure a wait for
// something asynchronous may last: VGPU_TEST_PATIENCE (a positive number),
// else 3 under CI (CI set and not "false") and 1 elsewhere. A CI machine
// may run the go test packages, the fuzz targets and the shared services
// on two busy cores; a wait's figure is what it needs on a quiet machine.
// It lengthens only the time before a test gives up: a test that passes
// takes no longer.
func Patience() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("VGPU_TEST_PATIENCE"), 64); err == nil && v > 0 {
		return v
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
		return 3
	}
	return 1
}

// Within is d stretched by Patience.
func Within(d time.Duration) time.Duration {
	return time.Duration(float64(d) * Patience())
}

// WaitFor polls ok every 50 ms until it holds, failing t after
// Within(within) with what it waited for.
func WaitFor(t testing.TB, within time.Duration, what string, ok func() bool) {
	t.Helper()
	limit := Within(within)
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
