package agent

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// FakeFaultsFile is fakehost.FaultsFile: the agent (serve --fake-host)
// reads it every fakeFaultsPoll, injects each line into the NVML mock and
// removes the file; a line whose Xid cannot be posted yet (the agent's
// event set not registered) stays for the next read.
const FakeFaultsFile = fakehost.FaultsFile

const fakeFaultsPoll = 500 * time.Millisecond

// watchFakeFaults injects the faults of dir's FakeFaultsFile into m until
// ctx ends.
func watchFakeFaults(ctx context.Context, dir string, m *gpu.Mock, log *slog.Logger) {
	path := filepath.Join(dir, FakeFaultsFile)
	wake.Every(ctx, fakeFaultsPoll, func(context.Context) { injectFaults(path, m, log) })
}

// injectFaults injects the faults of the file at path into m once, and
// leaves in the file those that could not be injected yet (none: the file
// is removed).
func injectFaults(path string, m *gpu.Mock, log *slog.Logger) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		log.Warn("fake host: cannot read the injected faults", "file", path, logkey.Err, err)
		return
	}
	var left []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		done, err := injectFault(m, line)
		if err != nil {
			log.Warn("fake host: injected fault ignored", "line", line, logkey.Err, err)
			continue
		}
		if !done {
			left = append(left, line)
			continue
		}
		log.Info("fake host: GPU fault injected", "fault", line)
	}
	if len(left) == 0 {
		err = os.Remove(path)
	} else {
		err = os.WriteFile(path, []byte(strings.Join(left, "\n")+"\n"), 0o644)
	}
	if err != nil {
		log.Warn("fake host: cannot update the injected faults", "file", path, logkey.Err, err)
	}
}

// injectFault applies one line of FakeFaultsFile; done is false when the
// Xid could not be posted yet.
func injectFault(m *gpu.Mock, line string) (done bool, err error) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return false, errors.New(`want "PCI xid N" or "PCI lost"`)
	}
	a, err := pci.Parse(f[0])
	if err != nil {
		return false, err
	}
	switch {
	case f[1] == "xid" && len(f) == 3:
		x, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			return false, err
		}
		return m.InjectXid(a, x), nil
	case f[1] == "lost" && len(f) == 2:
		m.SetLost(a, true)
		return true, nil
	}
	return false, errors.New(`want "PCI xid N" or "PCI lost"`)
}
