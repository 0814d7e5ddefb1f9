package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func newMigrateCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "migrate",
		Short: "Apply or show the database migrations ([database] connection)",
	}
	c.AddCommand(&cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (safe to run again; replicas wait on a lock)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			pool, err := openStore(cmd.Context(), v)
			if err != nil {
				return err
			}
			defer pool.Close()
			applied, err := store.Migrate(cmd.Context(), pool, g.Logger(v))
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(g.Stdout, "schema is current; nothing to apply")
				return nil
			}
			fmt.Fprintf(g.Stdout, "applied %d migration(s): %v\n", len(applied), applied)
			return nil
		},
	})
	c.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "List migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			pool, err := openStore(cmd.Context(), v)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := store.Status(cmd.Context(), pool)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tFILE\tSTATE\tAPPLIED AT")
			for _, s := range st {
				state, at := "pending", ""
				if s.Applied {
					state, at = "applied", s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
				}
				fmt.Fprintf(tw, "%05d\t%s\t%s\t%s\n", s.Version, s.Name, state, at)
			}
			return tw.Flush()
		},
	})
	return c
}

// openStore opens the database pool of v's [database] section, for the
// commands that work on the database without serving.
func openStore(ctx context.Context, v *conf.Values) (*pgxpool.Pool, error) {
	sc, err := bridge.StoreConfig(v)
	if err != nil {
		return nil, err
	}
	return store.Open(ctx, sc)
}
