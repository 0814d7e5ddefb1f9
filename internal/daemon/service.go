package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/gmr"
	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// Service is what a serving daemon shows the outside besides its own
// work: the Guru Meditation Report written on SIGUSR2, and systemd's
// notifications (READY=1, STOPPING=1, WATCHDOG=1) when systemd runs it
// as a Type=notify unit ($NOTIFY_SOCKET set). Without systemd the
// notifications do nothing.
type Service struct {
	// Report is the SIGUSR2 report; components add their sections.
	Report *gmr.Report

	log          *slog.Logger
	readyOnce    sync.Once
	ready        chan struct{}
	stoppingOnce sync.Once
}

// Serve starts what every serving daemon has: the SIGUSR2 report (written
// to standard error, the log stream, until ctx ends) with the version,
// uptime, configuration v with secrets masked, goroutines and runtime
// statistics, and STOPPING=1 sent to systemd as soon as ctx ends. The
// serve command defers Stopping for the other ways out.
func (g *Globals) Serve(ctx context.Context, v *conf.Values, log *slog.Logger) *Service {
	started := time.Now()
	rep := gmr.New(g.Spec.Name)
	rep.Add(
		gmr.Section{Name: "Package", Write: func(w io.Writer) { packageSection(w, g.Spec.Name, started) }},
		gmr.Section{Name: "Configuration", Write: func(w io.Writer) { configSection(w, v) }},
		gmr.Runtime(),
		gmr.Goroutines(),
	)
	s := &Service{Report: rep, log: log, ready: make(chan struct{})}

	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	go func() {
		defer signal.Stop(usr2)
		for {
			select {
			case <-ctx.Done():
				return
			case <-usr2:
				// One Write: the report's lines are not interleaved
				// with log records.
				if _, err := g.Stderr.Write(rep.Bytes(time.Now())); err != nil {
					log.Error("SIGUSR2: cannot write the Guru Meditation Report", "err", err)
					continue
				}
				log.Info("SIGUSR2: Guru Meditation Report written to standard error")
			}
		}
	}()
	context.AfterFunc(ctx, s.Stopping)
	return s
}

// Stopping tells systemd that the daemon is shutting down (STOPPING=1),
// once: Serve does when ctx ends; a daemon that stops on its own (a
// component failed) calls it too.
func (s *Service) Stopping() { s.stoppingOnce.Do(func() { s.notify(sd.SdNotifyStopping) }) }

// Ready tells systemd that the daemon serves (READY=1), once.
func (s *Service) Ready(status string) {
	s.readyOnce.Do(func() {
		s.notify(sd.SdNotifyReady + "\nSTATUS=" + strings.ReplaceAll(status, "\n", " "))
		close(s.ready)
	})
}

// Status sets the unit's status line (systemctl status).
func (s *Service) Status(status string) { s.notify("STATUS=" + status) }

func (s *Service) notify(state string) {
	if _, err := sd.SdNotify(false, state); err != nil {
		s.log.Warn("systemd notification failed", "state", strings.SplitN(state, "\n", 2)[0], "err", err)
	}
}

// Watchdog pings systemd's watchdog (WATCHDOG=1) at half the interval the
// unit's WatchdogSec= asks ($WATCHDOG_USEC), from Ready on until ctx ends.
// Before each ping it asks health, bounded by the ping period: the ping
// goes when health answers, healthy or not, so systemd restarts only a
// daemon that stopped answering (a deadlock, a goroutine stuck past its
// deadline), never one that waits out an outage it retries by itself (a
// restart would only add a start to the outage, and abort an agent's
// command in the middle). An unhealthy answer sets the unit's status line
// (systemctl status: "degraded: …") and is logged once; /readyz says the
// same. Without a watchdog it returns at once.
func (s *Service) Watchdog(ctx context.Context, health func(context.Context) error) {
	interval, err := sd.SdWatchdogEnabled(false)
	if err != nil {
		s.log.Warn("systemd watchdog: bad $WATCHDOG_USEC", "err", err)
		return
	}
	if interval <= 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-s.ready:
	}
	period := interval / 2
	t := time.NewTicker(period)
	defer t.Stop()
	degraded := false
	for {
		hctx, cancel := context.WithTimeout(ctx, period)
		err := health(hctx) // a check that never returns stops the pings: that is a hang
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !degraded {
				s.log.Warn("degraded: a dependency does not answer; the daemon retries (the watchdog keeps pinging)", "err", err)
				s.Status("degraded: " + strings.ReplaceAll(err.Error(), "\n", " "))
			}
			degraded = true
		case degraded:
			s.log.Info("healthy again")
			s.Status("healthy")
			degraded = false
		}
		s.notify(sd.SdNotifyWatchdog)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func packageSection(w io.Writer, name string, started time.Time) {
	rows := [][2]string{
		{"name", name},
		{"version", version.Version()},
		{"commit", version.Commit()},
		{"go", runtime.Version()},
		{"platform", runtime.GOOS + "/" + runtime.GOARCH},
		{"pid", fmt.Sprint(os.Getpid())},
		{"started", started.UTC().Format(time.RFC3339)},
		{"uptime", time.Since(started).Round(time.Second).String()},
	}
	if h, err := os.Hostname(); err == nil {
		rows = append(rows, [2]string{"hostname", h})
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, st := range bi.Settings {
			switch st.Key {
			case "vcs.revision", "vcs.time", "vcs.modified", "-ldflags", "CGO_ENABLED", "GOAMD64":
				rows = append(rows, [2]string{"build " + st.Key, st.Value})
			}
		}
	}
	gmr.Table(w, rows)
}

// configSection is every option with its value and where it came from;
// secret options show "***" (conf.Values.Dump).
func configSection(w io.Writer, v *conf.Values) {
	for _, l := range v.Dump() {
		fmt.Fprintln(w, l)
	}
}
