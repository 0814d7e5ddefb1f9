package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
)

func newPurgeCmd(g *globals) *cobra.Command {
	var dryRun bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "purge",
		Short: "Delete history older than [retention] allows, now (or count it with --dry-run)",
		Long: "Deletes processed inbox events, dead letters, final requests (with their commands, decisions and " +
			"callbacks) and audit rows older than the ages of [retention], in batches, under the advisory lock " +
			"the serving replicas' purge loop takes (exit 1 if one of them is purging now). --dry-run counts " +
			"the rows instead.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			pool, err := openStore(ctx, v)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctl := controls.NewStore(pool, nil, g.Logger(v))
			got, err := ctl.Purge(ctx, bridge.RetentionConfig(v), dryRun)
			if errors.Is(err, controls.ErrPurgeBusy) {
				return fmt.Errorf("%w; try again later", err)
			}
			if err != nil {
				return err
			}
			verb := "deleted"
			if dryRun {
				verb = "would delete"
			}
			tables := make([]string, 0, len(got))
			for t := range got {
				tables = append(tables, t)
			}
			sort.Strings(tables)
			for _, t := range tables {
				fmt.Fprintf(g.Stdout, "%s %d %s\n", verb, got[t], t)
			}
			if len(tables) == 0 {
				fmt.Fprintln(g.Stdout, "nothing to purge: every [retention] age is 0")
			}
			return nil
		},
	}
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	c.Flags().DurationVar(&timeout, "timeout", time.Hour, "give up after this long")
	return c
}
