package placement

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// retireState is what the sync leader remembers of the undeclared
// bridge-owned GPUs it keeps because a vGPU is still allocated there: it
// warns once per provider, not every round.
type retireState struct {
	mu     sync.Mutex
	warned map[string]bool // provider uuid → warned that it is kept
}

// KeptOwned is the provider of a GPU no longer in [placement]
// bridge_owned_gpus that the bridge keeps, its inventory reserved
// whole, while units are allocated on it.
type KeptOwned struct {
	Provider string
	Name     string
	Host     string
	PCI      string
	Used     int
}

// undeclaredOwned lists the providers of BridgeClass under the compute
// nodes of the hosts the bridge knows (the hosts table) that no
// declaration of [placement] bridge_owned_gpus names: the providers of
// GPUs taken out of the option, or of hosts taken out of it. Providers of
// nodes the bridge knows no agent of are never listed: another bridge's
// (or a test's) are not this one's to judge.
func (s *Service) undeclaredOwned() []engine.GPU {
	declared := s.declaredOwnedNames()
	s.exMu.RLock()
	nodes := make([]string, 0, len(s.hostOf))
	for n := range s.hostOf {
		nodes = append(nodes, n)
	}
	s.exMu.RUnlock()
	var out []engine.GPU
	s.index.View(func(st engine.State) {
		for _, n := range nodes {
			for _, id := range st.HostGPUs(n) {
				g := st.GPU(id)
				if g == nil || g.Class != BridgeClass || declared[g.Name] || !strings.HasPrefix(g.Name, n+"_pci_") || g.PCIAddress() == "" {
					continue
				}
				c := *g
				h := *g.Host
				c.Host = &h
				out = append(out, c)
			}
		}
	})
	return out
}

// declaredOwnedNames are the provider names of the declared GPUs: under
// the node the hosts table maps the host to, and under the host's own
// name (a host whose node is its name, or not known yet).
func (s *Service) declaredOwnedNames() map[string]bool {
	out := map[string]bool{}
	s.exMu.RLock()
	defer s.exMu.RUnlock()
	for _, d := range s.cfg.OwnedGPUs {
		out[GPUProviderName(d.Host, d.PCI)] = true
		if n, ok := s.nodeOf[d.Host]; ok {
			out[GPUProviderName(n, d.PCI)] = true
		}
	}
	return out
}

// IsUndeclaredOwned reports whether g is the provider of a bridge-owned
// GPU that [placement] bridge_owned_gpus no longer declares (the sync
// leader deletes it once no unit is allocated there; until then it is
// kept, its inventory reserved whole).
func (s *Service) IsUndeclaredOwned(g *engine.GPU) bool {
	if g == nil || g.Class != BridgeClass || g.Host == nil {
		return false
	}
	return !s.declaredOwnedNames()[g.Name] && strings.HasPrefix(g.Name, g.Host.Name+"_pci_")
}

// RetireOwned deletes the providers of the bridge-owned GPUs that are no
// longer declared (undeclaredOwned). Each is first checked to be the
// bridge's (a child of its compute node's provider with BridgeClass
// inventory only: ownedProvider), then its inventory is reserved whole so
// that nothing new lands there, then, with no unit allocated, it is
// deleted (audited: placement.provider_delete) and the re-type the bridge
// recorded for the GPU is forgotten. One with units allocated (a vGPU of
// the bridge still there) is kept, reserved, and returned; it is deleted
// at a later round, once released. Placement refuses deleting a provider
// that holds allocations (409): a claim that landed between the check and
// the delete keeps it too. It returns how many providers it deleted.
func (s *Service) RetireOwned(ctx context.Context) (int, []KeptOwned, error) {
	if s.store == nil {
		return 0, nil, nil
	}
	cands := s.undeclaredOwned()
	s.retired.mu.Lock()
	for rp := range s.retired.warned { // declared again, or gone
		still := false
		for _, g := range cands {
			still = still || g.UUID == rp
		}
		if !still {
			delete(s.retired.warned, rp)
		}
	}
	s.retired.mu.Unlock()
	deleted := 0
	var kept []KeptOwned
	var firstErr error
	for _, g := range cands {
		k, gone, err := s.retireOne(ctx, g)
		switch {
		case err != nil:
			s.log.Warn("placement: undeclared bridge-owned GPU provider not retired", "provider", g.Name, logkey.Provider, g.UUID, logkey.Err, err)
			if firstErr == nil {
				firstErr = err
			}
		case gone:
			deleted++
		case k != nil:
			kept = append(kept, *k)
		}
	}
	if deleted > 0 {
		if _, err := s.SyncNow(ctx, false, nil); err != nil && !errors.Is(err, ErrSyncBusy) && firstErr == nil {
			firstErr = err
		}
	}
	return deleted, kept, firstErr
}

// retireOne retires the provider of one undeclared GPU: it reports the
// provider kept (units allocated), or deleted.
func (s *Service) retireOne(ctx context.Context, g engine.GPU) (*KeptOwned, bool, error) {
	node := g.Host.Name
	pci := g.PCIAddress()
	host := s.hostName(node)
	rp, err := s.ownedProvider(ctx, g.Name, g.Host.RootUUID)
	if errors.Is(err, ErrNotOwned) {
		s.log.Debug("placement: undeclared provider is not the bridge's", "provider", g.Name, logkey.Err, err)
		return nil, false, nil
	}
	if err != nil || rp == "" {
		return nil, false, err // rp "": gone meanwhile
	}
	reserved, err := s.reserveOwned(ctx, rp)
	if err != nil {
		return nil, false, fmt.Errorf("reserve %s: %w", g.Name, err)
	}
	if reserved {
		s.audit(ctx, "placement.provider_reserve", rp, map[string]any{"name": g.Name, "host": host, "pci_address": pci,
			"reason": "no longer in [placement] bridge_owned_gpus"})
	}
	used, err := s.ownedUsed(ctx, rp)
	if err != nil {
		return nil, false, err
	}
	k := &KeptOwned{Provider: rp, Name: g.Name, Host: host, PCI: pci, Used: used}
	if used > 0 {
		s.keptOwned(*k, "")
		return k, false, nil
	}
	sc := s.client.ServiceClient()
	err = resourceproviders.Delete(ctx, sc, rp).ExtractErr()
	switch {
	case gophercloud.ResponseCodeIs(err, 404): // another replica deleted it
		return nil, false, nil
	case gophercloud.ResponseCodeIs(err, 409): // a claim landed meanwhile (or a child appeared)
		s.keptOwned(*k, "Placement refused the delete (409): units allocated meanwhile")
		return k, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("delete provider %s: %w", g.Name, classify("DELETE /resource_providers/{uuid}", err))
	}
	s.log.Info("placement: undeclared bridge-owned GPU provider deleted", "provider", g.Name, logkey.Provider, rp, logkey.Host, host, "pci", pci)
	s.audit(ctx, "placement.provider_delete", rp, map[string]any{"name": g.Name, "host": host, "pci_address": pci, "parent": g.Host.RootUUID,
		"reason": "no longer in [placement] bridge_owned_gpus"})
	if _, err := s.store.Pool().Exec(ctx, `DELETE FROM owned_gpu_types WHERE host = $1 AND pci = $2`, host, pci); err != nil {
		return nil, true, fmt.Errorf("forget the re-type of %s/%s: %w", host, pci, err)
	}
	s.retired.mu.Lock()
	delete(s.retired.warned, rp)
	s.retired.mu.Unlock()
	return nil, true, nil
}

// keptOwned warns, once per provider, that an undeclared GPU's provider
// is kept while units are allocated on it.
func (s *Service) keptOwned(k KeptOwned, why string) {
	s.retired.mu.Lock()
	defer s.retired.mu.Unlock()
	if s.retired.warned == nil {
		s.retired.warned = map[string]bool{}
	}
	if s.retired.warned[k.Provider] {
		return
	}
	s.retired.warned[k.Provider] = true
	if why == "" {
		why = fmt.Sprintf("%d unit(s) of %s allocated", k.Used, BridgeClass)
	}
	s.log.Warn("placement: undeclared bridge-owned GPU provider kept, its inventory reserved, until its vGPUs are released",
		"provider", k.Name, logkey.Provider, k.Provider, logkey.Host, k.Host, "pci", k.PCI, "why", why)
}

// reserveOwned reserves rp's BridgeClass inventory whole (nothing new
// lands there; the units allocated stay), under its generation; it
// reports whether it wrote.
func (s *Service) reserveOwned(ctx context.Context, rp string) (bool, error) {
	sc := s.client.ServiceClient()
	for attempt := 0; ; attempt++ {
		inv, gen, err := s.client.Inventories(ctx, rp)
		if err != nil {
			return false, err
		}
		cur, ok := inv[BridgeClass]
		if !ok || cur.Reserved >= cur.Total {
			return false, nil
		}
		cur.Reserved = cur.Total
		err = putInventory(ctx, sc, rp, gen, map[string]engine.Inventory{BridgeClass: cur})
		if err == nil {
			return true, nil
		}
		if !IsConflict(err) || attempt >= 4 {
			return false, fmt.Errorf("inventory of %s: %w", rp, err)
		}
	}
}

// audit records a change in Placement through the configured auditor.
func (s *Service) audit(ctx context.Context, action, rp string, detail map[string]any) {
	if s.cfg.Auditor == nil {
		return
	}
	if err := s.cfg.Auditor.Audit(ctx, action, "resource_provider", rp, detail); err != nil {
		s.log.Warn("placement: audit", "action", action, logkey.Provider, rp, logkey.Err, err)
	}
}
