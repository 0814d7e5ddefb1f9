package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

func syncCmd(g *globals) *cobra.Command {
	var full bool
	var attempts int
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Sync the bridge's Placement mirror now (admin)",
		Long: `Sync the bridge's Placement mirror now: providers whose generation moved,
or every provider with --full. The bridge also syncs on its own every
[placement] sync_interval; use this after changing inventories or traits by
hand. A sync already running answers 409: vgpuctl waits and retries.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var res apiclient.SyncResult
			var err error
			for i := 0; ; i++ {
				res, err = g.api().Sync(cmd.Context(), full)
				e, busy := apiclient.AsError(err)
				if !busy || e.Status != http.StatusConflict || i+1 >= attempts {
					break
				}
				wait := 2 * time.Second
				if s, perr := strconv.Atoi(e.RetryAfter); perr == nil && s > 0 && s < 60 {
					wait = time.Duration(s) * time.Second
				}
				fmt.Fprintf(g.stderr, "a sync is running; retrying in %s\n", wait)
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(wait):
				}
			}
			if err != nil {
				return err
			}
			return g.emit(res.Raw, func(w io.Writer) {
				kv(w, "Full", yesNo(res.Full), "Providers", itoa(res.Providers), "Fetched", itoa(res.Fetched),
					"Removed", itoa(res.Removed), "GPUs", itoa(res.GPUs), "Duration", fmt.Sprintf("%.3fs", res.DurationSeconds))
			})
		},
	}
	cmd.Flags().BoolVar(&full, "full", false, "re-read every provider, not only those whose generation moved")
	cmd.Flags().IntVar(&attempts, "attempts", 5, "tries while another sync is running (409)")
	return cmd
}
