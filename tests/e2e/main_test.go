package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The package's shared Nova: started by the first test that asks for it
// (sharedNova), stopped by TestMain after every test. Starting Nova costs
// 20 s on a quiet machine and minutes on a busy one; a compute host more
// (AddHost) costs a few seconds. Each test adds hosts of its own, so
// tests do not see each other's instances on their hosts, agents or
// Placement providers.
var shared struct {
	once sync.Once
	n    *novaharness.Nova
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	testsvc.RemoveBinaries()
	if n := shared.n; n != nil {
		if code != 0 {
			n.MarkFailed()
			fmt.Fprintf(os.Stderr, "shared Nova (logs kept in %s):\n%s\n", n.Dir(), n.LogTail(40))
		}
		if err := n.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "stop the shared Nova: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedNova returns the package's Nova, starting it on first use. It
// has no compute host of its own: tests add theirs with AddHost.
func sharedNova(t *testing.T) *novaharness.Nova {
	t.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		// The alias of the Nova-owned VF GPUs (TestNovaOwnedVFs) is
		// nova-api's from the start.
		shared.n, shared.err = novaharness.New(ctx, novaharness.Options{PCIAliases: []string{novaOwnedVFs().AliasSpec()}})
		if shared.err == nil {
			t.Logf("shared Nova started in %s (%s)", shared.n.StartupTime().Round(100*time.Millisecond), shared.n.StartupPhases())
		}
	})
	if shared.err != nil {
		t.Fatalf("start the shared Nova: %v", shared.err)
	}
	n := shared.n
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("shared Nova logs (%s):\n%s", n.Dir(), n.LogTail(40))
		}
	})
	return n
}
