package placement

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// ClaimRequest asks for Count units for a consumer (a Nova instance).
type ClaimRequest struct {
	Consumer  string // instance uuid
	ProjectID string // needed when the consumer has no allocations yet
	UserID    string
	Request   engine.Request
	// Read, when set, is the consumer's allocations as the caller has
	// just read them (ReadVGPU): the first write starts from it instead
	// of reading them again. The consumer generation guards that write,
	// so a Read gone stale costs a conflict and a fresh read, never a
	// lost update. Claim does not modify it.
	Read *Consumer
	// ConsumerType of a new consumer ("": the configured one, INSTANCE);
	// ReservationConsumerType for a reservation (Reserve).
	ConsumerType string
}

// Claim is a granted claim.
type Claim struct {
	Consumer   string
	Provider   string
	Host       string
	Class      string
	Amount     int // units added by this claim
	Held       int // units of Class the consumer now holds on Provider
	Generation int // provider generation after the claim
	Attempts   int
}

// maxCandidateRounds bounds re-decisions after capacity conflicts.
const maxCandidateRounds = 8

// Claim writes the consumer's allocations to hold the request on the best
// candidate, keeping what the consumer already holds. Generation
// conflicts are refreshed and retried with backoff until ctx ends;
// capacity conflicts move on to the next candidate; when none is left it
// returns an error wrapping ErrNoCapacity. The mirror and index learn the
// outcome at once.
func (s *Service) Claim(ctx context.Context, cr ClaimRequest) (*Claim, error) {
	if cr.Consumer == "" {
		return nil, fmt.Errorf("claim: %w: no consumer", engine.ErrInvalidRequest)
	}
	q := cr.Request
	q.AllowRetype = false
	// Nova-owned VF GPUs are Nova's to hand out (flavors with a PCI
	// alias): the bridge mirrors them, never claims on them.
	q.ExcludeClasses = append(slices.Clone(q.ExcludeClasses), slices.Sorted(maps.Keys(s.cfg.NovaVFClasses))...)
	tried := map[string]bool{}
	attempts := 0
	read := cr.Read
	for round := 0; round < maxCandidateRounds; round++ {
		q.ExcludeGPUs = append(append([]string(nil), cr.Request.ExcludeGPUs...), keys(tried)...)
		cands, err := s.decide(q)
		if err != nil {
			return nil, fmt.Errorf("claim %s: %w", cr.Consumer, err)
		}
		if len(cands) == 0 {
			// A claim on given hosts that finds nothing at all may meet
			// a mirror that has not seen the host's GPUs yet (added
			// since the last sync: a move's re-apply follows Nova there
			// at once); Placement is asked before the answer is no.
			if round == 0 && len(tried) == 0 && len(q.Hosts) > 0 && s.resyncForClaim(ctx) {
				continue
			}
			break
		}
		for _, c := range cands {
			tried[c.GPU.UUID] = true
			cl, err := s.claimOn(ctx, cr, c.GPU, &attempts, &read)
			switch {
			case err == nil:
				return cl, nil
			case IsCapacity(err):
				s.log.Debug("claim: candidate full, next", logkey.Consumer, cr.Consumer, logkey.Provider, c.GPU.UUID)
				s.refreshProvider(ctx, c.GPU.UUID)
				continue
			default:
				return nil, fmt.Errorf("claim %s on %s: %w", cr.Consumer, c.GPU.UUID, err)
			}
		}
	}
	return nil, fmt.Errorf("claim %s: %w (%d GPUs tried)", cr.Consumer, ErrNoCapacity, len(tried))
}

// claimResyncEvery is the least time between two syncs that claims
// finding no candidate run (resyncForClaim): a flood of requests for a
// full host costs Placement one incremental sync per period at most.
const claimResyncEvery = 5 * time.Second

// resyncForClaim runs an incremental sync for a claim that found no
// candidate on the hosts it names, unless one ran less than
// claimResyncEvery ago or another replica holds the sync; it reports
// whether the index may have learned something. A claim runs with no
// transaction open, as the sync's Placement calls need.
func (s *Service) resyncForClaim(ctx context.Context) bool {
	now := time.Now().UnixNano()
	last := s.claimSyncAt.Load()
	if now-last < int64(claimResyncEvery) || !s.claimSyncAt.CompareAndSwap(last, now) {
		return false
	}
	if _, err := s.SyncNow(ctx, false, nil); err != nil {
		s.log.Debug("claim: sync for a claim with no candidate", logkey.Err, err)
		return false
	}
	return true
}

// ClaimOn adds cr's units to the consumer's allocations on GPU provider
// provider, whatever the engine would rank (a vGPU held off its host,
// claimed again where its mdev is): the host may still be excluded from
// new placements then. Not enough room there is ErrNoCapacity.
func (s *Service) ClaimOn(ctx context.Context, cr ClaimRequest, provider string) (*Claim, error) {
	if cr.Consumer == "" {
		return nil, fmt.Errorf("claim: %w: no consumer", engine.ErrInvalidRequest)
	}
	g, ok := s.index.Lookup(provider)
	if !ok {
		return nil, fmt.Errorf("claim %s on %s: %w (the provider is not known)", cr.Consumer, provider, ErrNoCapacity)
	}
	for _, t := range cr.Request.Required {
		if t != "" && !g.HasTrait(t) && !g.Host.HasTrait(t) {
			return nil, fmt.Errorf("claim %s on %s: %w (the GPU does not offer %s)", cr.Consumer, provider, ErrNoCapacity, t)
		}
	}
	attempts := 0
	read := cr.Read
	cl, err := s.claimOn(ctx, cr, &g, &attempts, &read)
	if err != nil && IsCapacity(err) {
		s.refreshProvider(ctx, provider)
		return nil, fmt.Errorf("claim %s on %s: %w: %v", cr.Consumer, provider, ErrNoCapacity, err)
	}
	if err != nil {
		return nil, fmt.Errorf("claim %s on %s: %w", cr.Consumer, provider, err)
	}
	return cl, nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// claimOn adds the request to the consumer's allocations on g, retrying
// generation conflicts until ctx ends. Its first attempt starts from
// *read when that is set, and uses it up.
func (s *Service) claimOn(ctx context.Context, cr ClaimRequest, g *engine.GPU, attempts *int, read **Consumer) (*Claim, error) {
	n := cr.Request.Count
	if n == 0 {
		n = 1
	}
	var b Backoff
	target, lostWrite := -1, false
	for {
		*attempts++
		con := (*read).clone()
		*read = nil
		if con == nil {
			var err error
			if con, err = s.client.Allocations(ctx, cr.Consumer); err != nil {
				return nil, err
			}
			s.consumers.put(con)
		}
		held := con.Providers[g.UUID][g.Class]
		if target < 0 {
			target = held + n
		} else if lostWrite && held >= target {
			// An earlier PUT went through but its answer was lost.
			cl := &Claim{Consumer: cr.Consumer, Provider: g.UUID, Host: g.Host.Name, Class: g.Class, Amount: n, Held: held, Attempts: *attempts}
			cl.Generation = s.learn(ctx, g.UUID, cr.Consumer, g.Class, held)
			return cl, nil
		}
		if con.Generation == nil || con.ProjectID == "" {
			con.ProjectID, con.UserID = cr.ProjectID, cr.UserID
		}
		if con.ProjectID == "" || con.UserID == "" {
			return nil, fmt.Errorf("%w: a new consumer needs project and user", engine.ErrInvalidRequest)
		}
		if con.Type == "" {
			con.Type = cmp.Or(cr.ConsumerType, s.cfg.ConsumerType)
		}
		res := maps.Clone(con.Providers[g.UUID])
		if res == nil {
			res = map[string]int{}
		}
		res[g.Class] += n
		con.Providers[g.UUID] = res
		err := s.client.PutAllocations(ctx, con)
		if err == nil {
			s.consumers.wrote(con)
			cl := &Claim{Consumer: cr.Consumer, Provider: g.UUID, Host: g.Host.Name, Class: g.Class, Amount: n, Held: res[g.Class], Attempts: *attempts}
			cl.Generation = s.learnDelta(ctx, g.UUID, cr.Consumer, g.Class, res[g.Class], n)
			return cl, nil
		}
		s.consumers.forget(cr.Consumer)
		if !IsConflict(err) && !IsRetryable(err) {
			return nil, err
		}
		lostWrite = lostWrite || IsRetryable(err)
		s.log.Debug("claim: retry", logkey.Consumer, cr.Consumer, logkey.Provider, g.UUID, logkey.Attempt, *attempts, logkey.Err, err)
		if werr := b.Wait(ctx); werr != nil {
			return nil, fmt.Errorf("%w (gave up: %v)", err, werr)
		}
	}
}

// Release removes the consumer's vGPU units from provider (all vGPU
// providers when provider is ""), keeping its other allocations.
func (s *Service) Release(ctx context.Context, consumer, provider string) error {
	var b Backoff
	for {
		con, err := s.client.Allocations(ctx, consumer)
		if err != nil {
			return fmt.Errorf("release %s: %w", consumer, err)
		}
		s.consumers.put(con)
		type change struct {
			rp, class string
			held      int
		}
		var changed []change
		for rp, res := range con.Providers {
			if provider != "" && rp != provider {
				continue
			}
			for _, c := range s.classes() {
				if n, ok := res[c]; ok {
					res = maps.Clone(res)
					delete(res, c)
					con.Providers[rp] = res
					changed = append(changed, change{rp, c, n})
				}
			}
		}
		if len(changed) == 0 {
			return nil
		}
		if con.Type == "" {
			con.Type = s.cfg.ConsumerType
		}
		err = s.client.PutAllocations(ctx, con)
		if err == nil {
			s.consumers.wrote(con)
			for _, c := range changed {
				s.learnDelta(ctx, c.rp, consumer, c.class, 0, -c.held)
			}
			return nil
		}
		s.consumers.forget(consumer)
		if !IsConflict(err) && !IsRetryable(err) {
			return fmt.Errorf("release %s: %w", consumer, err)
		}
		if werr := b.Wait(ctx); werr != nil {
			return fmt.Errorf("release %s: %w", consumer, err)
		}
	}
}

// ReleaseUnits takes amount units of class off the consumer's allocation
// on provider, keeping the rest of its allocations (other units there
// included: a direct-path release gives back one vGPU, where Release drops
// them all). heldAfter is what the consumer held there right after the
// claim being undone: when it now holds less, the release is taken as
// done already (a retry after a crash). A consumer-generation conflict is
// read again and retried with backoff; the mirror and index learn the
// result.
func (s *Service) ReleaseUnits(ctx context.Context, consumer, provider, class string, amount, heldAfter int) error {
	var b Backoff
	for {
		con, err := s.client.Allocations(ctx, consumer)
		if err != nil {
			return fmt.Errorf("release %d %s of %s on %s: %w", amount, class, consumer, provider, err)
		}
		s.consumers.put(con)
		res := con.Providers[provider]
		held := res[class]
		if held == 0 || (heldAfter > 0 && held < heldAfter) {
			// Nothing there (Nova deleted the consumer) or released
			// already. Placement does not bump a provider's generation
			// when allocations are deleted, so the incremental sync would
			// not notice: bring the mirror and the index up to date here.
			s.learn(ctx, provider, consumer, class, held)
			return nil
		}
		res = maps.Clone(res)
		if held <= amount {
			delete(res, class)
		} else {
			res[class] = held - amount
		}
		if len(res) == 0 {
			delete(con.Providers, provider)
		} else {
			con.Providers[provider] = res
		}
		if con.Type == "" {
			con.Type = s.cfg.ConsumerType
		}
		err = s.client.PutAllocations(ctx, con)
		if err == nil {
			s.consumers.wrote(con)
			s.learnDelta(ctx, provider, consumer, class, res[class], res[class]-held)
			return nil
		}
		s.consumers.forget(consumer)
		if !IsConflict(err) && !IsRetryable(err) {
			return fmt.Errorf("release %d %s of %s on %s: %w", amount, class, consumer, provider, err)
		}
		if werr := b.Wait(ctx); werr != nil {
			return fmt.Errorf("release %d %s of %s on %s: %w", amount, class, consumer, provider, err)
		}
	}
}

// Learn records, in the index and the mirror, a change a caller made to
// consumer's allocation on rp outside Claim and Release; held is what the
// consumer holds of class there now.
func (s *Service) Learn(ctx context.Context, rp, consumer, class string, held int) {
	s.learn(ctx, rp, consumer, class, held)
}

// learn reads the provider's new usage and generation and writes them to
// the index and the mirror; it returns the generation (0 if unknown).
func (s *Service) learn(ctx context.Context, rp, consumer, class string, held int) int {
	u, gen, err := s.client.Usages(ctx, rp)
	if err != nil {
		s.log.Warn("claim: cannot read usage back; the next sync corrects the mirror", logkey.Provider, rp, logkey.Err, err)
		return 0
	}
	s.index.SetUsage(rp, u[class], gen)
	s.mirrorAllocation(ctx, rp, consumer, class, held, u[class], gen)
	return gen
}

// mirrorAllocation writes what the consumer holds on rp, and the
// provider's usage and generation, to the mirror; a failure is logged
// (the next sync corrects it).
func (s *Service) mirrorAllocation(ctx context.Context, rp, consumer, class string, held, used, gen int) {
	if s.store == nil {
		return
	}
	if err := s.store.SetAllocation(ctx, rp, consumer, class, held, used, gen); err != nil {
		s.log.Warn("claim: mirror update failed; the next sync corrects it", logkey.Provider, rp, logkey.Err, err)
	}
}

// learnDelta records a change the bridge just made to consumer's
// allocation on rp: held is what the consumer holds of class there now,
// delta how much that changed the provider's usage. Unlike learn it reads
// nothing back from Placement, so a claim or release costs one call
// (plus the consumer's read when it is not known): the index and the
// mirror add delta to what they knew. What others change on the provider
// meanwhile (Nova) bumps its generation, which the incremental sync
// notices; a claim that meets a full provider re-reads its usage first
// (refreshProvider). It returns the provider generation the index knows.
func (s *Service) learnDelta(ctx context.Context, rp, consumer, class string, held, delta int) int {
	used, gen, ok := s.index.AddUsage(rp, delta)
	if !ok {
		return 0
	}
	s.mirrorAllocation(ctx, rp, consumer, class, held, used, gen)
	return gen
}

// refreshProvider re-reads one provider's usage into the index.
func (s *Service) refreshProvider(ctx context.Context, rp string) {
	g, ok := s.index.Lookup(rp)
	if !ok {
		return
	}
	u, gen, err := s.client.Usages(ctx, rp)
	if err != nil {
		return
	}
	s.index.SetUsage(rp, u[g.Class], gen)
}

// Holding is a consumer's vGPU units on one GPU provider.
type Holding struct {
	Provider   string `json:"provider_uuid"`
	Host       string `json:"host,omitempty"`
	PCIAddress string `json:"pci_address,omitempty"`
	Class      string `json:"resource_class"`
	Amount     int    `json:"amount"`
	Trait      string `json:"trait,omitempty"`
	Profile    string `json:"profile,omitempty"`
}

// LookupVGPU asks Placement which GPU providers hold the instance's vGPU
// units (GET /allocations/{instance}); after Nova creates or resizes a
// vGPU instance, notifications do not say. Empty when it holds none.
func (s *Service) LookupVGPU(ctx context.Context, instance string) ([]Holding, error) {
	out, _, err := s.ReadVGPU(ctx, instance)
	return out, err
}

// ReadVGPU is LookupVGPU that also returns the allocations it read, for
// a Claim that follows (ClaimRequest.Read) to start from.
func (s *Service) ReadVGPU(ctx context.Context, instance string) ([]Holding, *Consumer, error) {
	con, err := s.client.Allocations(ctx, instance)
	if err != nil {
		return nil, nil, fmt.Errorf("lookup vGPU of %s: %w", instance, err)
	}
	s.consumers.put(con)
	return s.holdingsOf(con), con, nil
}

// holdingsOf lists con's vGPU units by GPU provider.
func (s *Service) holdingsOf(con *Consumer) []Holding {
	var out []Holding
	for rp, res := range con.Providers {
		for _, c := range s.classes() {
			n, ok := res[c]
			if !ok {
				continue
			}
			h := Holding{Provider: rp, Class: c, Amount: n}
			if g, ok := s.index.Lookup(rp); ok {
				h.Host, h.PCIAddress = g.Host.Name, g.PCIAddress()
				if len(g.Types) > 0 {
					h.Trait = g.Types[0]
					h.Profile = s.profileName(h.Trait)
				}
			}
			out = append(out, h)
		}
	}
	return out
}
