package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// reloadOnSignal reloads the agent's keys on every SIGHUP until ctx ends.
// With load (the configuration read again, as serve does), the paths and
// key_id come from the new configuration, so a new signing key arrives
// with its new key_id; without it the same files are re-read. A failed
// reload keeps the keys in use (security.Reload logs why). What needs a
// restart ([DEFAULT] transport_url, [security] require_signed_commands)
// is logged and keeps its start value.
func reloadOnSignal(ctx context.Context, sec *security, start *conf.Values, load func() (*conf.Values, error), log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info("SIGHUP: reloading keys")
			if load == nil {
				_ = sec.Reload()
				continue
			}
			v, err := load()
			if err != nil {
				sec.reloads.WithLabelValues("failed").Inc()
				log.Error("SIGHUP: the configuration does not load; keeping the keys in use", logkey.Err, err.Error())
				continue
			}
			_ = sec.ReloadFrom(v, start)
		}
	}
}

// ReloadFrom installs the key files and key_id that v names; on error
// the keys (and paths) in use stay. start is the configuration the agent
// started with, to tell what only a restart changes.
func (s *security) ReloadFrom(v, start *conf.Values) error {
	var restart []string
	for _, o := range []conf.String{optTransportURL, optTransportURLFile, optRequireSigned} {
		if o.Get(v) != o.Get(start) {
			restart = append(restart, "["+o.Option().Section+"] "+o.Option().Name)
		}
	}
	if optSignResults.Get(v) != optSignResults.Get(start) {
		restart = append(restart, "[security] sign_results")
	}
	if len(restart) > 0 {
		s.log.Warn("changed options take effect only after a restart", "needs_restart", restart)
	}
	if s.required && optBridgeKeysFile.Get(v) == "" {
		err := errors.New("[security] bridge_keys_file is now empty, but signed commands are required")
		s.reloads.WithLabelValues("failed").Inc()
		s.log.Error("key reload failed; keeping the keys in use", logkey.Err, err)
		return err
	}
	s.mu.Lock()
	old := [3]string{s.keysFile, s.keyFile, s.keyID}
	s.keysFile, s.keyFile, s.keyID = optBridgeKeysFile.Get(v), "", optKeyID.Get(v)
	if optSignResults.Get(start) { // turning signing off or on takes a restart
		s.keyFile = optSigningKeyFile.Get(v)
	}
	s.mu.Unlock()
	if err := s.Reload(); err != nil {
		s.mu.Lock()
		s.keysFile, s.keyFile, s.keyID = old[0], old[1], old[2]
		s.mu.Unlock()
		return fmt.Errorf("reload: %w", err)
	}
	return nil
}
