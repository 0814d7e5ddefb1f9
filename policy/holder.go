package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// Config names the files a policy is built from. The bridge fills it from
// its [policy] options.
type Config struct {
	RulesFile    string        // [policy] rules_file: etc/vgpu-bridge/rules.yaml
	ProfilesFile string        // [policy] profiles_file: etc/vgpu-bridge/profiles.yaml; "" = no seed
	CompatFile   string        // [policy] driver_compat_file; "" = no driver checks
	Interval     time.Duration // [policy] reload_interval for Watch; 0 = no polling
	Clock        func() time.Time
}

// Build loads the three files of cfg into a policy. The catalog it returns
// is the one the policy reads: feed agents' reports to it with Observe.
func Build(cfg Config, cat *catalog.Catalog) (*Policy, error) {
	if cat == nil {
		cat = catalog.New()
		if cfg.ProfilesFile != "" {
			seed, err := catalog.LoadFile(cfg.ProfilesFile)
			if err != nil {
				return nil, err
			}
			cat.Merge(seed)
		}
	}
	var compat *Compat
	if cfg.CompatFile != "" {
		c, err := LoadCompatFile(cfg.CompatFile)
		if err != nil {
			return nil, err
		}
		compat = c
	}
	return LoadFile(cfg.RulesFile, Options{Catalog: cat, Compat: compat, Clock: cfg.Clock})
}

// Holder holds the active policy and replaces it on reload. A broken new
// file is refused and the old policy stays active. Safe for concurrent use.
type Holder struct {
	cfg     Config
	cat     *catalog.Catalog
	cur     atomic.Pointer[Policy]
	mu      sync.Mutex // serialises reloads
	sum     [32]byte
	mtime   time.Time
	reloads atomic.Uint64
	fails   atomic.Uint64
	lastErr atomic.Pointer[string]
}

// NewHolder loads the policy of cfg; it fails if the files are broken. The
// catalog (nil: one seeded from cfg.ProfilesFile) is kept across reloads, so
// what agents reported survives them.
func NewHolder(cfg Config, cat *catalog.Catalog) (*Holder, error) {
	if cat == nil {
		cat = catalog.New()
		if cfg.ProfilesFile != "" {
			seed, err := catalog.LoadFile(cfg.ProfilesFile)
			if err != nil {
				return nil, err
			}
			cat.Merge(seed)
		}
	}
	h := &Holder{cfg: cfg, cat: cat}
	if err := h.Reload(); err != nil {
		return nil, err
	}
	return h, nil
}

// Policy returns the active policy.
func (h *Holder) Policy() *Policy { return h.cur.Load() }

// Catalog returns the profile catalog shared by every policy of the holder.
func (h *Holder) Catalog() *catalog.Catalog { return h.cat }

// Stats returns how many reloads succeeded and failed, and the last error.
func (h *Holder) Stats() (reloads, failures uint64, lastErr string) {
	if p := h.lastErr.Load(); p != nil {
		lastErr = *p
	}
	return h.reloads.Load(), h.fails.Load(), lastErr
}

// Reload reads the files again. On error the active policy is kept and the
// error returned (the caller logs it; Stats counts it).
func (h *Holder) Reload() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reloadLocked()
}

func (h *Holder) reloadLocked() error {
	data, err := os.ReadFile(h.cfg.RulesFile)
	if err == nil && len(bytes.TrimSpace(data)) == 0 {
		// An editor or a configuration tool that writes the file in place
		// truncates it first: a poll may see it empty. An empty file is
		// never a policy ("rules: []" is one with no rules).
		err = fmt.Errorf("rules file %s is empty (still being written?)", h.cfg.RulesFile)
	}
	var p *Policy
	if err == nil {
		p, err = Build(h.cfg, h.cat)
	}
	if err != nil {
		h.fails.Add(1)
		s := err.Error()
		h.lastErr.Store(&s)
		return fmt.Errorf("reload policy: %w", err)
	}
	if st, err := os.Stat(h.cfg.RulesFile); err == nil {
		h.mtime = st.ModTime()
	}
	h.sum = sha256.Sum256(data)
	h.cur.Store(p)
	h.reloads.Add(1)
	empty := ""
	h.lastErr.Store(&empty)
	return nil
}

// RulesFile is the rules file in use.
func (h *Holder) RulesFile() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cfg.RulesFile
}

// Check builds the policy of the rules file at path with the holder's
// other files and catalog, without installing it.
func (h *Holder) Check(path string) error {
	h.mu.Lock()
	cfg := h.cfg
	h.mu.Unlock()
	cfg.RulesFile = path
	if _, err := Build(cfg, h.cat); err != nil {
		return fmt.Errorf("rules file %s: %w", path, err)
	}
	return nil
}

// SetRulesFile makes the rules file at path the one in use, and loads it;
// on error the active policy and its file stay.
func (h *Holder) SetRulesFile(path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.cfg.RulesFile
	h.cfg.RulesFile = path
	if err := h.reloadLocked(); err != nil {
		h.cfg.RulesFile = old
		return err
	}
	return nil
}

// Watch polls the rules file's modification time and content hash every
// interval and reloads when it changed; it returns when ctx ends. Errors
// are logged, and the old policy stays.
func (h *Holder) Watch(ctx context.Context, interval time.Duration, log *slog.Logger) {
	if interval <= 0 {
		interval = h.cfg.Interval
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	wake.Every(ctx, interval, func(context.Context) {
		changed, err := h.changed()
		if err != nil || !changed {
			return
		}
		if err := h.Reload(); err != nil {
			if log != nil {
				log.Error("policy reload refused; keeping the active policy", "error", err.Error())
			}
			// Remember the broken content so it is not retried every tick.
			h.mu.Lock()
			if data, err := os.ReadFile(h.cfg.RulesFile); err == nil { // under mu: SetRulesFile changes it
				h.sum = sha256.Sum256(data)
			}
			if st, err := os.Stat(h.cfg.RulesFile); err == nil {
				h.mtime = st.ModTime()
			}
			h.mu.Unlock()
		} else if log != nil {
			log.Info("policy reloaded", "policy", h.Policy().Hash())
		}
	})
}

func (h *Holder) changed() (bool, error) {
	path := h.RulesFile()
	st, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	h.mu.Lock()
	mtime, sum := h.mtime, h.sum
	h.mu.Unlock()
	if st.ModTime().Equal(mtime) {
		return false, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	s := sha256.Sum256(data)
	if bytes.Equal(s[:], sum[:]) {
		h.mu.Lock()
		h.mtime = st.ModTime()
		h.mu.Unlock()
		return false, nil
	}
	return true, nil
}
