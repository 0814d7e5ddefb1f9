package testsvc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var binaries struct {
	sync.Mutex
	dir   string
	built map[string]error
}

// Binary builds cmd/NAME of this module once per test process and returns
// the path of the binary (in a temporary folder that stays for the
// process's other tests).
func Binary(t testing.TB, name string) string {
	t.Helper()
	binaries.Lock()
	defer binaries.Unlock()
	if binaries.built == nil {
		dir, err := os.MkdirTemp("", "vgpu-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binaries.dir, binaries.built = dir, map[string]error{}
	}
	path := filepath.Join(binaries.dir, name)
	err, done := binaries.built[name]
	if !done {
		goTool, lerr := exec.LookPath("go")
		if lerr != nil {
			goTool = "/usr/local/go/bin/go"
		}
		out, berr := exec.Command(goTool, "build", "-o", path, "github.com/vgpu-bridge/vgpu-bridge/cmd/"+name).CombinedOutput()
		if berr != nil {
			err = fmt.Errorf("go build ./cmd/%s: %w\n%s", name, berr, out)
		}
		binaries.built[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// RemoveBinaries removes what Binary built; call it from TestMain after
// m.Run.
func RemoveBinaries() {
	binaries.Lock()
	defer binaries.Unlock()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
		binaries.dir, binaries.built = "", nil
	}
}

// LastLines returns the last n lines of s (a log, for a failure message).
func LastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
