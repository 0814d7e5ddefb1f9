package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

func newSyncCmd(g *globals) *cobra.Command {
	var full bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "sync",
		Short: "Sync the Placement mirror now (incremental by generation, or --full)",
		Long: "Reads Placement's resource providers (nested trees, inventories, traits, usages, aggregates, " +
			"allocations on vGPU providers) into the database mirror, under the advisory lock that keeps " +
			"one syncer active across bridge replicas. A progress bar shows on a terminal; otherwise " +
			"progress goes to the structured log.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			log := g.Logger(v)
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			pool, err := openStore(ctx, v)
			if err != nil {
				return err
			}
			defer pool.Close()
			host, _ := os.Hostname()
			pc, err := bridge.PlacementConfig(v, host+" (vgpu-bridge sync)")
			if err != nil {
				return err
			}
			pc.Auditor = requests.Auditor{DB: pool, Actor: "vgpu-bridge/" + pc.Replica}
			svc, err := placement.New(ctx, pc, pool, nil, log)
			if err != nil {
				return err
			}
			progress, finish := syncProgress(g, log)
			st, err := svc.SyncNow(ctx, full, progress)
			finish()
			if err != nil {
				return err
			}
			fmt.Fprintf(g.Stdout, "synced %d providers (%d read, %d removed), %d GPUs, in %s\n",
				st.Providers, st.Fetched, st.Removed, st.GPUs, st.Duration.Round(time.Millisecond))
			return nil
		},
	}
	c.Flags().BoolVar(&full, "full", false, "re-read every provider, not only those whose generation moved")
	c.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "give up after this long")
	return c
}

// syncProgress draws a bar when stderr is a terminal, and logs every few
// seconds otherwise.
func syncProgress(g *globals, log interface {
	Info(string, ...any)
}) (placement.Progress, func()) {
	if f, ok := g.Stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		var (
			mu  sync.Mutex
			bar *progressbar.ProgressBar
		)
		return func(done, total int) {
				mu.Lock()
				defer mu.Unlock()
				if bar == nil {
					bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(f), progressbar.OptionSetDescription("providers"),
						progressbar.OptionShowCount(), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
				}
				bar.Set(done) //nolint:errcheck
			}, func() {
				mu.Lock()
				defer mu.Unlock()
				if bar != nil {
					bar.Finish() //nolint:errcheck
				}
			}
	}
	var mu sync.Mutex
	last := time.Time{}
	return func(done, total int) {
		mu.Lock()
		defer mu.Unlock()
		if done == total || time.Since(last) >= 5*time.Second {
			last = time.Now()
			log.Info("placement sync progress", "done", done, "total", total)
		}
	}, func() {}
}
