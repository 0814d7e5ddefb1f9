// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// diagnoseCmd asks a host's agent for a diagnostics bundle through the
// bridge, waits for it and writes it to -o FILE.
func diagnoseCmd(g *globals) *cobra.Command {
	var instance string
	var wait, poll, agentTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "diagnose HOST",
		Short: "Collect a host's diagnostics bundle (tar.gz) through the bridge (admin)",
		Long: `Ask the bridge to have HOST's agent collect a diagnostics bundle (POST
/v1/hosts/{name}/diagnostics, a signed collect_diagnostics command), wait until
it is complete (GET /v1/diagnostics/{id}) and write the tar.gz
(GET /v1/diagnostics/{id}/bundle) to -o FILE ("-" is standard output; without
-o: diagnostics-HOST-ID.tar.gz). For this command -o names the file, not an
output format.

The bundle holds diagnose.json (the agent's checks), nvidia-bug-report.log.gz
(when the host has nvidia-bug-report.sh), domains/UUID.xml (--instance's, else
every domain with a vGPU), nvrm.log (the kernel's NVRM lines), sysfs.txt (mdev
and VF state), agent.log (its tail, when [diagnostics] log_file is set),
journal.json, version.txt, agent.conf (secrets masked) and MANIFEST.json
(each part's size, and what was skipped or truncated and why).

Exit 1 when the agent failed or did not answer in time, 6 when --wait-timeout
passed first (the request goes on: GET /v1/diagnostics/ID).`,
		Example: `  vgpuctl diagnose compute-0012 -o bundle.tar.gz
  vgpuctl diagnose compute-0012 --instance 0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01 -o vm.tar.gz`,
		Args: cobra.ExactArgs(1),
		// -o is a file here: no output-format check.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, args []string) error {
			file := g.output
			if !cmd.Flags().Changed("output") {
				file = ""
			}
			return g.diagnose(cmd.Context(), args[0], instance, file, agentTimeout, wait, poll)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&instance, "instance", "", "only this instance's domain XML (UUID)")
	fl.DurationVar(&wait, "wait-timeout", 15*time.Minute, "give up waiting (exit 6) after this long")
	fl.DurationVar(&poll, "interval", 2*time.Second, "how often to ask whether the bundle is there")
	fl.DurationVar(&agentTimeout, "agent-timeout", 10*time.Minute, "how long the agent has to answer (the command's expiry)")
	return cmd
}

func (g *globals) diagnose(ctx context.Context, host, instance, file string, agentTimeout, wait, poll time.Duration) error {
	d, err := g.api().RequestDiagnostics(ctx, host, instance, agentTimeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stderr, "%s diagnostics %s of host %s: %s\n", ts(time.Now()), d.ID, host, d.Status)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	t := time.NewTicker(max(poll, 100*time.Millisecond))
	defer t.Stop()
	for d.Status == "pending" {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return exitError{exitGaveUp, fmt.Errorf("diagnostics %s is still pending after %s (GET /v1/diagnostics/%s)", d.ID, wait, d.ID)}
		case <-t.C:
		}
		if d, err = g.api().Diagnostics(wctx, d.ID); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
	if d.Status != "complete" {
		return fmt.Errorf("diagnostics %s of host %s %s: %s", d.ID, host, d.Status, d.Error)
	}
	b, err := g.api().DiagnosticsBundle(ctx, d.ID)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	if d.SHA256 != "" && hex.EncodeToString(sum[:]) != d.SHA256 {
		return fmt.Errorf("diagnostics %s: the bundle's SHA-256 is not the one recorded (%s)", d.ID, d.SHA256)
	}
	if file == "" {
		file = "diagnostics-" + host + "-" + d.ID + ".tar.gz"
	}
	if file == "-" {
		_, err = g.stdout.Write(b)
		return err
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return fmt.Errorf("write the bundle: %w", err)
	}
	fmt.Fprintf(g.stderr, "%s diagnostics %s: %d bytes written to %s\n", ts(time.Now()), d.ID, len(b), file)
	return nil
}
