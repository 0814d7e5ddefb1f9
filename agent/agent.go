// Package agent is vgpu-agent, the daemon on each compute host: it
// discovers GPUs and vGPU types, executes the bridge's commands against
// libvirt, sysfs and NVML, and reports the host's state.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vgpu-bridge/vgpu-bridge/etc/conf"
)

// Build information, set by the linker through cmd/vgpu-agent.
var (
	Version = "dev"
	Commit  = "unknown"
)

// Host returns [DEFAULT] host, or the machine's host name.
func Host(v *conf.Values) string {
	if h := optHost.Get(v); h != "" {
		return h
	}
	h, _ := os.Hostname()
	return h
}

// Run runs the agent until ctx ends.
func Run(ctx context.Context, v *conf.Values, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host := Host(v)
	log = log.With("host", host)
	for _, w := range v.Warnings {
		log.Warn("configuration", "warning", w)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"ok"}`)
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
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("vgpu-agent started", "version", Version, "listen", ln.Addr().String())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), optShutdownTimeout.Get(v))
	defer cancel()
	return srv.Shutdown(sctx)
}
