// Package agent is vgpu-agent, the daemon on each compute host: it
// discovers GPUs and vGPU types, executes the bridge's commands against
// libvirt, sysfs and NVML, and reports the host's state.
package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vgpu-bridge/vgpu-bridge/agent/executor"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/metrics"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
	"github.com/vgpu-bridge/vgpu-bridge/internal/gmr"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// Build information (package internal/version).
var (
	Version = version.Version()
	Commit  = version.Commit()
)

// FailAfterStep, followed by "<kind>/<step>", names the failpoint
// (internal/failpoint, VGPU_FAILPOINT) the agent hits once a command's step
// is journaled: with VGPU_FAILPOINT=agent.after_step:attach_vgpu/mdev_created
// it dies by SIGKILL between creating an mdev and attaching it, as on a
// crash. RunOptions.AfterStep, when set, replaces it.
const FailAfterStep = "agent.after_step:"

// Host returns [DEFAULT] host, or the machine's host name.
func Host(v *conf.Values) string {
	if h := optHost.Get(v); h != "" {
		return h
	}
	h, _ := os.Hostname()
	return h
}

// RunOptions are what the command line adds to the configuration.
type RunOptions struct {
	// FakeHostDir runs the agent on the simulated host under this
	// directory (vgpu-agent serve --fake-host DIR).
	FakeHostDir string
	// AfterStep is a test hook run after each journaled command step.
	AfterStep func(c protocol.Command, step string)
	// Now is the clock of the signature checks (key grace periods);
	// nil is time.Now.
	Now func() time.Time
	// LoadConfig reads the configuration again on SIGHUP, so that new key
	// paths and key_id apply (serve sets it); nil re-reads the same files.
	LoadConfig func() (*conf.Values, error)
	// Drivers, when set, are the host drivers to run on instead of
	// opening them; the caller keeps and closes them. Tests share a fake
	// host's drivers (its libvirt test driver lives in one connection)
	// with the code that plays Nova's libvirt driver on that host.
	Drivers *Drivers
	// Report, when set, gets the agent's sections of the Guru Meditation
	// Report (SIGUSR2): recovery, journal, RabbitMQ session.
	Report *gmr.Report
	// Ready, when set, is called once the agent serves: connected to
	// RabbitMQ with its first report confirmed by the broker (without
	// [DEFAULT] transport_url: once recovery is done). healthy is the
	// watchdog's check (the agent can take commands); its answer sets the
	// unit's status, and only a check that does not return stops the pings.
	Ready func(status string, healthy func(context.Context) error)
}

// Run runs the agent until ctx ends.
func Run(ctx context.Context, v *conf.Values, log *slog.Logger) error {
	return RunWith(ctx, v, log, RunOptions{})
}

// RunWith runs the agent until ctx ends: it opens the host drivers and the
// journal, finishes or rolls back the commands a previous run left in the
// middle, recreates the devices the journal owns that are missing (reboot
// recovery), then serves /healthz, /readyz and /metrics, consumes commands
// and sends reports until ctx ends.
func RunWith(ctx context.Context, v *conf.Values, log *slog.Logger, o RunOptions) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host := Host(v)
	log = log.With(logkey.Host, host)
	for _, w := range v.Warnings {
		log.Warn("configuration", "warning", w)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var drv *Drivers
	var err error
	journalPath := JournalPath(v)
	if o.Drivers != nil {
		drv = o.Drivers
		if o.FakeHostDir != "" && v.Source(conf.DefaultSection, "state_path") == "default" {
			journalPath = filepath.Join(o.FakeHostDir, "state", "journal")
		}
	} else if o.FakeHostDir != "" {
		drv, err = OpenFakeHost(o.FakeHostDir)
		if v.Source(conf.DefaultSection, "state_path") == "default" {
			journalPath = filepath.Join(o.FakeHostDir, "state", "journal")
		}
	} else {
		drv, err = OpenDrivers(v, log.With("component", "drivers"))
	}
	if err != nil {
		return fmt.Errorf("host drivers: %w", err)
	}
	if o.Drivers == nil {
		defer drv.Close()
	}
	if o.FakeHostDir != "" && drv.NVMLMock != nil {
		go watchFakeFaults(ctx, o.FakeHostDir, drv.NVMLMock, log.With("component", "fakehost")) // make demo's GPU fault
	}
	j, err := journal.Open(journalPath, journal.OptionsFrom(v))
	if err != nil {
		return err
	}
	defer j.Close()

	// Keys before any command: a bad key file stops the agent here.
	sec, err := newSecurity(v, log.With("component", "security"), reg, o.Now)
	if err != nil {
		return err
	}
	go reloadOnSignal(ctx, sec, v, o.LoadConfig, log) // SIGHUP (reload.go)

	scanner := drv.Scanner(v)
	reg.MustRegister(metrics.New(scanner, 0))
	ec := executor.ConfigFrom(v) // cold_shutdown_timeout, command_timeout, command_clock_skew
	ec.Host, ec.Journal, ec.Sysfs = host, j, drv.Sysfs
	ec.Domains, ec.GPUs = domains{conn: drv.Libvirt, hp: drv.HotPlug}, drv.GPU
	ec.Limiter = limiter{conn: drv.Libvirt, cg: drv.Cgroup}
	ec.Diagnoser, ec.Bundler = drv.Diagnoser(v), drv.Bundler(v, j)
	ec.Health, ec.Allow = &healthCache{scan: scanner, ttl: 5 * time.Second}, drv.Allow
	ec.Log, ec.Registerer, ec.AfterStep = log.With("component", "executor"), reg, o.AfterStep
	if ec.AfterStep == nil {
		ec.AfterStep = func(c protocol.Command, step string) { failpoint.Hit(FailAfterStep + string(c.Kind) + "/" + step) }
	}
	ex, err := executor.New(ec)
	if err != nil {
		return err
	}

	var loopp atomic.Pointer[transport.Loop]
	var recovered atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		checks := map[string]string{"journal": "ok", "recovery": "done", "rabbitmq": "connected"}
		ready := true
		if !recovered.Load() {
			checks["recovery"], ready = "running", false
		}
		switch l := loopp.Load(); {
		case l == nil:
			checks["rabbitmq"], ready = "not configured", false
		case !l.Ready():
			checks["rabbitmq"], ready = "disconnected", false
		}
		w.Header().Set("Content-Type", "application/json")
		status := "ready"
		if !ready {
			status = "not_ready"
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "checks": checks})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ln, err := net.Listen("tcp", optListen.Get(v))
	if err != nil {
		return fmt.Errorf("agent listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, MaxHeaderBytes: 32 << 10}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", logkey.Err, err)
		}
	}()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if o.Report != nil {
		o.Report.Add(gmr.Section{Name: "Agent", Write: func(w io.Writer) {
			st := "running"
			if recovered.Load() {
				st = "done"
			}
			gmr.Table(w, [][2]string{{"host", host}, {"listen", ln.Addr().String()}, {"journal", journalPath},
				{"fake_host", o.FakeHostDir}, {"recovery", st}})
		}}, gmr.Section{Name: "RabbitMQ", Write: func(w io.Writer) {
			l := loopp.Load()
			if l == nil {
				fmt.Fprintln(w, "no session (recovery running, or no [DEFAULT] transport_url)")
				return
			}
			st := l.Status()
			last := "never"
			if !st.LastReport.IsZero() {
				last = st.LastReport.UTC().Format(time.RFC3339)
			}
			gmr.Table(w, [][2]string{{"broker", st.Broker}, {"connected", fmt.Sprint(st.Connected)},
				{"command_queue", st.Queue}, {"pending_results", fmt.Sprint(st.PendingResults)},
				{"reports_sent", fmt.Sprint(st.ReportsSent)}, {"last_report", last}})
		}})
	}
	log.Info("vgpu-agent started", "version", Version, "listen", ln.Addr().String(), "journal", journalPath,
		"fake_host", o.FakeHostDir)

	// Recovery before any new command.
	results := ex.Recover(ctx)
	rec, err := ex.Reconcile(ctx)
	if err != nil {
		log.Error("reboot recovery: cannot read the host", logkey.Err, err)
	} else if len(rec.Recreated)+len(rec.Failed)+len(rec.Skipped) > 0 {
		log.Info("reboot recovery", "recreated", rec.Recreated, "failed", rec.Failed, "skipped", rec.Skipped)
	}
	recovered.Store(true)

	raw := optTransportURL.Get(v)
	if raw == "" && optTransportURLFile.Get(v) == "" {
		log.Warn("no [DEFAULT] transport_url: not taking commands")
		if o.Ready != nil {
			o.Ready("recovery done; no transport_url, not taking commands", func(context.Context) error { return nil })
		}
		<-ctx.Done()
		return nil
	}
	tu, err := TransportURL(v)
	if err != nil {
		return err
	}
	var tlsFn func() (*tls.Config, error)
	if tu.TLS {
		if _, err := TLSConfig(v); err != nil { // fail at start, not at each reconnection
			return fmt.Errorf("[amqp] TLS: %w", err)
		}
		tlsFn = func() (*tls.Config, error) { return TLSConfig(v) }
	}
	tc := transport.ConfigFrom(v) // command_prefetch, reconnect_max_backoff, report_*
	tc.URLs, tc.Redacted, tc.Host = tu.AMQPURLs(), tu.Redacted(), host
	tc.TLS, tc.Verifier, tc.Signer = tlsFn, sec, sec
	tc.StopGrace, tc.Log, tc.Registerer = optShutdownTimeout.Get(v), log.With("component", "transport"), reg
	loop, err := transport.New(tc, ex, reporter{scan: scanner, journal: j}, ex.Changed())
	if err != nil {
		return err
	}
	loop.Enqueue(results...)
	loopp.Store(loop)
	if o.Ready != nil {
		go func() {
			select {
			case <-ctx.Done():
			case <-loop.Reported():
				o.Ready("connected to RabbitMQ; reported host "+host, func(context.Context) error {
					if !loop.Ready() {
						return errors.New("not connected to RabbitMQ")
					}
					return nil
				})
			}
		}()
	}
	return loop.Run(ctx)
}
