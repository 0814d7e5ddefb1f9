package bridge

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/gmr"
)

// ReportSections are the bridge's own sections of the Guru Meditation
// Report (SIGUSR2, internal/gmr): its database pool, its brokers and the
// outcome of every readiness check.
func (d *Daemon) ReportSections() []gmr.Section { return d.sections }

// Healthy is the watchdog's check (systemd WatchdogSec=): the bridge can
// do its work while its database answers, since every part of it keeps
// its state there. Its answer sets the unit's status; only a check that
// does not return stops the pings (daemon.Service.Watchdog).
func (d *Daemon) Healthy(ctx context.Context) error {
	if err := d.Pool.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	return nil
}

func reportSections(pool *pgxpool.Pool, srv *api.Server, tu, ntu *conf.TransportURL) []gmr.Section {
	return []gmr.Section{
		{Name: "Database pool", Write: func(w io.Writer) { poolSection(w, pool.Stat()) }},
		{Name: "Brokers", Write: func(w io.Writer) {
			gmr.Table(w, [][2]string{
				{"transport_url", tu.Redacted()},
				{"notifications transport_url", ntu.Redacted()},
			})
		}},
		{Name: "Readiness checks", Write: func(w io.Writer) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			checks := srv.Checks(ctx)
			rows := make([][2]string, 0, len(checks))
			for _, name := range slices.Sorted(maps.Keys(checks)) {
				rows = append(rows, [2]string{name, checks[name]})
			}
			gmr.Table(w, rows)
		}},
	}
}

func poolSection(w io.Writer, st *pgxpool.Stat) {
	gmr.Table(w, [][2]string{
		{"max_conns", fmt.Sprint(st.MaxConns())},
		{"total_conns", fmt.Sprint(st.TotalConns())},
		{"acquired_conns", fmt.Sprint(st.AcquiredConns())},
		{"idle_conns", fmt.Sprint(st.IdleConns())},
		{"constructing_conns", fmt.Sprint(st.ConstructingConns())},
		{"acquire_count", fmt.Sprint(st.AcquireCount())},
		{"acquire_duration", st.AcquireDuration().String()},
		{"empty_acquire_count", fmt.Sprint(st.EmptyAcquireCount())},
		{"canceled_acquire_count", fmt.Sprint(st.CanceledAcquireCount())},
		{"new_conns_count", fmt.Sprint(st.NewConnsCount())},
	})
}
