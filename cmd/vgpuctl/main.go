// Command vgpuctl is the operator's command line for the vgpu-bridge API:
// fleet and request views, placement dry runs, policy explanations and a
// signing webhook sender. Table output by default, -o json|yaml for
// scripts; exit codes are listed in `vgpuctl --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
