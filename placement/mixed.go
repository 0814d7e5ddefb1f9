package placement

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// MixedClaim asks for Count vGPUs of the type of Trait on a mixed
// bridge-owned GPU of Host (declared HOST/PF=mixed) for Consumer.
type MixedClaim struct {
	Consumer, ProjectID, UserID string
	Host                        string // Nova's compute service host of the instance
	Trait                       string
	Count                       int      // vGPUs (0: 1)
	Exclude                     []string // GPU providers the claim must not use
	Read                        *Consumer
}

// ClaimMixed claims c on a mixed GPU of c.Host: the type's framebuffer
// (as the host's agent last reported it) times c.Count in MiB of
// BridgeFBClass, added to the consumer's allocations under its
// generation. Placement checks the capacity: a GPU whose framebuffer left
// does not hold it answers so and the next GPU of the host (by PCI
// address) is tried; a GPU an operator drained (the gpus table) is
// skipped. No GPU of the host holding it is ErrNoCapacity,
// saying why for each; a host with no mixed GPU is ErrNoCapacity too.
// The Claim's Amount is MiB, Amount/Count per vGPU.
func (s *Service) ClaimMixed(ctx context.Context, c MixedClaim) (*Claim, error) {
	n := max(c.Count, 1)
	var decls []OwnedDecl
	for _, d := range s.cfg.OwnedGPUs {
		if d.Host == c.Host && d.Mixed() {
			decls = append(decls, d)
		}
	}
	if len(decls) == 0 {
		return nil, fmt.Errorf("%w: host %s", ErrNoMixedGPUs, c.Host)
	}
	if s.store == nil {
		return nil, fmt.Errorf("%w: no database", ErrNoCapacity)
	}
	r, err := s.hostReport(ctx, c.Host)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCapacity, err)
	}
	slices.SortFunc(decls, func(a, b OwnedDecl) int { return strings.Compare(a.PCI, b.PCI) })
	read := c.Read
	var why []string
	for _, d := range decls {
		g, ok := ownedReportGPU(r, d.PCI, MixedType)
		if !ok {
			why = append(why, d.PCI+": not in its agent's last report as a vendor-VFIO GPU")
			continue
		}
		i := slices.IndexFunc(g.Types, func(t protocol.VGPUType) bool { return catalog.TraitFor(t.ID) == c.Trait })
		if i < 0 || g.Types[i].FramebufferMiB <= 0 {
			why = append(why, fmt.Sprintf("%s: its agent reports no %s with a framebuffer", d.PCI, c.Trait))
			continue
		}
		rp, err := s.ownedRP(ctx, r, d.Host, d.PCI)
		if err != nil {
			why = append(why, d.PCI+": "+err.Error())
			continue
		}
		if slices.Contains(c.Exclude, rp) {
			why = append(why, d.PCI+": excluded by the request")
			continue
		}
		if s.gpuDrained(rp) {
			why = append(why, d.PCI+": drained by an operator")
			continue
		}
		s.mixedRPs.Store(rp, d.PCI)
		amount := n * g.Types[i].FramebufferMiB
		cl, err := s.claimMixedOn(ctx, c, rp, amount, &read)
		if IsCapacity(err) {
			why = append(why, fmt.Sprintf("%s: %d MiB for %d × %s do not fit its framebuffer left (Placement: %v)", d.PCI, amount, n, c.Trait, err))
			continue
		}
		if err != nil {
			return nil, err
		}
		cl.Host = c.Host
		return cl, nil
	}
	return nil, fmt.Errorf("%w: no mixed GPU of host %s holds %d × %s (%s)", ErrNoCapacity, c.Host, n, c.Trait, strings.Join(why, "; "))
}

// claimMixedOn adds amount MiB of BridgeFBClass on rp to the consumer's
// allocations, retrying generation conflicts until ctx ends (a capacity
// refusal is returned as it is).
func (s *Service) claimMixedOn(ctx context.Context, c MixedClaim, rp string, amount int, read **Consumer) (*Claim, error) {
	var b Backoff
	target, lostWrite := -1, false
	for attempts := 1; ; attempts++ {
		con := (*read).clone()
		*read = nil
		if con == nil {
			var err error
			if con, err = s.client.Allocations(ctx, c.Consumer); err != nil {
				return nil, err
			}
			s.consumers.put(con)
		}
		held := con.Providers[rp][BridgeFBClass]
		if target < 0 {
			target = held + amount
		} else if lostWrite && held >= target {
			return &Claim{Consumer: c.Consumer, Provider: rp, Class: BridgeFBClass, Amount: amount, Held: held, Attempts: attempts}, nil
		}
		if con.Generation == nil || con.ProjectID == "" {
			con.ProjectID, con.UserID = c.ProjectID, c.UserID
		}
		if con.ProjectID == "" || con.UserID == "" {
			return nil, fmt.Errorf("%w: a new consumer needs project and user", engine.ErrInvalidRequest)
		}
		con.Type = cmp.Or(con.Type, s.cfg.ConsumerType)
		res := maps.Clone(con.Providers[rp])
		if res == nil {
			res = map[string]int{}
		}
		res[BridgeFBClass] += amount
		con.Providers[rp] = res
		err := s.client.PutAllocations(ctx, con)
		if err == nil {
			s.consumers.wrote(con)
			return &Claim{Consumer: c.Consumer, Provider: rp, Class: BridgeFBClass, Amount: amount, Held: res[BridgeFBClass], Attempts: attempts}, nil
		}
		s.consumers.forget(c.Consumer)
		if !IsConflict(err) && !IsRetryable(err) {
			return nil, err
		}
		lostWrite = lostWrite || IsRetryable(err)
		s.log.Debug("claim on a mixed GPU: retry", logkey.Consumer, c.Consumer, logkey.Provider, rp, logkey.Attempt, attempts, logkey.Err, err)
		if werr := b.Wait(ctx); werr != nil {
			return nil, fmt.Errorf("%w (gave up: %v)", err, werr)
		}
	}
}

// MixedPCI is the PF of the mixed bridge-owned GPU whose provider is rp,
// as this process published or claimed on it ("" when it did neither).
func (s *Service) MixedPCI(rp string) string {
	if v, ok := s.mixedRPs.Load(rp); ok {
		return v.(string)
	}
	return ""
}

// ErrNoMixedGPUs is ErrNoCapacity for a host with no mixed GPU in
// [placement] bridge_owned_gpus.
var ErrNoMixedGPUs = fmt.Errorf("%w: no mixed GPU in [placement] bridge_owned_gpus", ErrNoCapacity)

// errMixedNotRetyped says a mixed GPU is never re-typed: it offers every
// type its agent reports.
var errMixedNotRetyped = errors.New("a mixed GPU offers every type its agent reports and is not re-typed")
