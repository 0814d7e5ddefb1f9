// Package failpoint lets crash tests kill the process at a named step.
// With VGPU_FAILPOINT=NAME in its environment, the process sends itself
// SIGKILL when it reaches Hit(NAME): nothing deferred runs, nothing is
// flushed, as when a host loses power. Without the variable, Hit costs a
// string comparison. Never set it in a deployment.
package failpoint

import (
	"os"
	"syscall"
)

// Env is the environment variable that names the failpoint to fire.
const Env = "VGPU_FAILPOINT"

var armed = os.Getenv(Env)

// Hit kills the process when name is the armed failpoint.
func Hit(name string) {
	if armed == "" || armed != name {
		return
	}
	os.Stderr.WriteString("failpoint " + name + ": SIGKILL\n") //nolint:errcheck
	syscall.Kill(os.Getpid(), syscall.SIGKILL)                 //nolint:errcheck
	select {}                                                  // the signal is on its way
}
