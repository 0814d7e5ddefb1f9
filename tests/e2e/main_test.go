package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
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
	once      sync.Once
	n         *novaharness.Nova
	err       error
	imagesDir string // writeSharedImages's, removed at the end
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
	if shared.imagesDir != "" {
		os.RemoveAll(shared.imagesDir)
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
		// The images of sharedImages are every service's from the start.
		images, err := writeSharedImages()
		if err != nil {
			shared.err = err
			return
		}
		shared.n, shared.err = novaharness.New(ctx, novaharness.Options{PCIAliases: []string{novaOwnedVFs().AliasSpec()},
			ImagesFile: images})
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

// Images the shared Nova has beside novaharness.ImageID: copies of it
// with a trait:...=required property (TestGuestDriverTraitsKeepNovaOff).
const (
	imageGuestDriverR570 = "3f4c2b9e-5a70-4c1e-9d57-0e57a0570570"
	imageGuestDriverR550 = "3f4c2b9e-5a50-4c1e-9d57-0e57a0550550"
)

// writeSharedImages writes the images file of the shared Nova
// (novaharness.Options.ImagesFile) and returns its path.
func writeSharedImages() (string, error) {
	image := func(id string, branch int) map[string]any {
		return map[string]any{"id": id, "name": fmt.Sprintf("guest-driver-r%d", branch),
			"container_format": "raw", "disk_format": "raw", "size": "25165824",
			"properties": map[string]any{"kernel_id": "nokernel", "ramdisk_id": "nokernel", "architecture": "x86_64",
				"trait:" + placement.GuestDriverTrait(branch): "required"}}
	}
	b, err := json.Marshal([]map[string]any{image(imageGuestDriverR570, 570), image(imageGuestDriverR550, 550)})
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "e2e-images-")
	if err != nil {
		return "", err
	}
	shared.imagesDir = dir
	path := filepath.Join(dir, "images.json")
	return path, os.WriteFile(path, b, 0o644)
}
