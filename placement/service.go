package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
	"github.com/vgpu-bridge/vgpu-bridge/placement/mirror"
	"github.com/vgpu-bridge/vgpu-bridge/placement/novaconf"
)

// Config configures the placement feature. The bridge maps its
// [placement] and [openstack] options into it.
type Config struct {
	Client ClientConfig
	// Zero fields take DefaultConfig's values (the options' defaults).
	//
	// Classes are the resource classes treated as vGPU.
	Classes []string
	// TypePrefix marks vGPU type traits.
	TypePrefix string
	// SyncInterval between incremental syncs.
	SyncInterval time.Duration
	// FullSyncInterval between full syncs (0 takes the default,
	// negative disables periodic full syncs after the first).
	FullSyncInterval time.Duration
	// SyncConcurrency is the number of parallel Placement reads.
	SyncConcurrency int
	// TraitListingMin: see Syncer.TraitListingMin (default 200).
	TraitListingMin int
	// AddTypeTraits (opt-in): the sync leader adds to each GPU provider
	// without a type trait the one its agent reports (AddTypeTraits).
	AddTypeTraits bool
	// AddDriverTraits (opt-in): the sync leader keeps on each GPU provider
	// the guest driver traits its host's vGPU manager serves
	// (SyncDriverTraits), as GuestBranches says.
	AddDriverTraits bool
	// GuestBranches lists the guest driver branches a host serves (the
	// policy's driver compatibility matrix); nil adds no driver traits.
	GuestBranches func(hypervisor, driverVersion string) []int
	// StaleReportAge excludes hosts whose last agent report is older
	// (hosts that never reported are not excluded).
	StaleReportAge time.Duration
	// OwnedGPUs are the GPUs (VF GPUs, mdev GPUs) the operator declared
	// bridge-owned ([placement] bridge_owned_gpus): the sync leader
	// keeps a provider of class BridgeClass for each (PublishOwned).
	OwnedGPUs []OwnedDecl
	// RetypeOnDemand (opt-in, [placement] retype_on_demand): a direct-path
	// claim that finds no capacity may re-type an empty bridge-owned GPU
	// of the instance's host (RetypeOnDemand).
	RetypeOnDemand bool
	// RetypeStepHook, when set, is called each time a re-type of a
	// bridge-owned GPU has recorded a step (RetypeWithdrawing,
	// RetypeTyped, RetypeDone); an error it returns stops the re-type
	// there, as a crash would. Tests set it.
	RetypeStepHook func(step string) error
	// NovaVFClasses are the resource classes of Nova's PCI providers whose
	// VFs are vGPUs (Nova-owned VF GPUs), each with its numeric vGPU type
	// id ([placement] nova_vf_resource_classes): mirrored and indexed as
	// GPUs of that type, never claimed by the direct path (Claim).
	NovaVFClasses map[string]string
	// ConsumerType written with claims (1.38+).
	ConsumerType string
	// Replica names this process in the sync state (default hostname).
	Replica string
	// Auditor records the changes the service makes in Placement (a
	// trait it adds); nil records none. The bridge hands in its audit
	// log's writer.
	Auditor Auditor
}

// Auditor records a change the service made in Placement: what it did
// (action) to which object, and the detail (JSON-encoded).
type Auditor interface {
	Audit(ctx context.Context, action, objectType, objectID string, detail any) error
}

func (c *Config) defaults() {
	d := DefaultConfig()
	if len(c.Classes) == 0 {
		c.Classes = d.Classes
	}
	if c.TypePrefix == "" {
		c.TypePrefix = d.TypePrefix
	}
	if c.SyncInterval <= 0 {
		c.SyncInterval = d.SyncInterval
	}
	if c.FullSyncInterval == 0 {
		c.FullSyncInterval = d.FullSyncInterval
	}
	if c.SyncConcurrency <= 0 {
		c.SyncConcurrency = d.SyncConcurrency
	}
	if c.StaleReportAge <= 0 {
		c.StaleReportAge = d.StaleReportAge
	}
	if c.ConsumerType == "" {
		c.ConsumerType = d.ConsumerType
	}
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
	}
}

// Service is the placement feature: sync loop, index, decisions, claims.
type Service struct {
	cfg     Config
	client  *Client
	store   *mirror.Store
	index   *index.Index
	engine  *engine.Engine
	catalog *catalog.Catalog
	syncer  *Syncer
	log     *slog.Logger

	consumers consumerCache // allocations and generations the bridge last read or wrote (consumers.go)
	retired   retireState   // undeclared bridge-owned GPUs kept while in use (retire.go)

	syncMu  sync.Mutex  // one sync at a time in this process
	leading atomic.Bool // this replica holds the sync lock in Run
	// claimSyncAt is when a claim that found no candidate last synced
	// (Service.Claim, resyncForClaim; UnixNano).
	claimSyncAt atomic.Int64
	synced      atomic.Bool // the index holds the result of a full sync
	// faultTrait is set once nova.GPUFaultTrait exists in Placement
	// (SyncFaultTraits creates it at the first sync).
	faultTrait atomic.Bool
	loaded     chan struct{} // closed when synced first is (Loaded)
	loadedOnce sync.Once

	exMu         sync.RWMutex
	excludeHosts []string          // node names
	excludeGPUs  []string          // provider uuids
	nodeOf       map[string]string // compute service host → node
	hostOf       map[string]string // node → compute service host

	mixedRPs sync.Map // provider uuid → PF of the mixed bridge-owned GPUs this process published or claimed on
}

// New builds the service. pool may be nil (no mirror: the index is filled
// straight from Placement); cat may be nil (no profile names, no
// re-typing advice).
func New(ctx context.Context, cfg Config, pool *pgxpool.Pool, cat *catalog.Catalog, log *slog.Logger) (*Service, error) {
	cfg.defaults()
	if !slices.Contains(cfg.Classes, BridgeClass) {
		// The bridge's own GPUs are GPUs too (they are the only providers
		// of this class: no operator option is needed to see them).
		cfg.Classes = append(slices.Clone(cfg.Classes), BridgeClass)
	}
	classTypes := map[string]string{}
	for _, c := range slices.Sorted(maps.Keys(cfg.NovaVFClasses)) {
		// Nova's PCI providers of these classes are GPUs too, typed by
		// the option (their trait, when the device_spec gives one, is
		// not under type_trait_prefix).
		if !slices.Contains(cfg.Classes, c) {
			cfg.Classes = append(slices.Clone(cfg.Classes), c)
		}
		classTypes[c] = catalog.TraitFor(cfg.NovaVFClasses[c])
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := NewClient(ctx, cfg.Client)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:       cfg,
		client:    c,
		index:     index.New(index.Config{Classes: cfg.Classes, TypePrefix: cfg.TypePrefix, ClassTypes: classTypes}),
		catalog:   cat,
		log:       log,
		nodeOf:    map[string]string{},
		consumers: consumerCache{max: defaultConsumerCache},
		hostOf:    map[string]string{},
		loaded:    make(chan struct{}),
	}
	s.engine = &engine.Engine{TypePrefix: cfg.TypePrefix}
	if cat != nil {
		s.engine.Retype = s.retype
	}
	if pool != nil {
		s.store = mirror.New(pool, cfg.Classes, cfg.TypePrefix).WithClassTypes(cfg.NovaVFClasses)
	}
	s.syncer = &Syncer{Client: c, Store: s.store, Index: s.index, Classes: cfg.Classes, Concurrency: cfg.SyncConcurrency, TraitListingMin: cfg.TraitListingMin, Log: log}
	return s, nil
}

// Client returns the Placement client.
func (s *Service) Client() *Client { return s.client }

// Index returns the in-memory index.
func (s *Service) Index() *index.Index { return s.index }

// Store returns the mirror (nil without a database).
func (s *Service) Store() *mirror.Store { return s.store }

// Engine returns the decision engine.
func (s *Service) Engine() *engine.Engine { return s.engine }

func (s *Service) classes() []string { return s.cfg.Classes }

// retype: an empty GPU typed from can become to when both profiles are of
// the same GPU model and to allows count instances.
func (s *Service) retype(from, to string, count int) (int, bool) {
	pf, ok1 := s.catalog.ByTrait(from)
	pt, ok2 := s.catalog.ByTrait(to)
	if !ok1 || !ok2 || pf.GPU == "" || pf.GPU != pt.GPU || pt.MaxInstances < count {
		return 0, false
	}
	return pt.MaxInstances, true
}

func (s *Service) profileName(trait string) string {
	if s.catalog == nil {
		return ""
	}
	if p, ok := s.catalog.ByTrait(trait); ok {
		return p.Name
	}
	return ""
}

// SyncNow runs one sync (full or incremental) now, under the cluster-wide
// advisory lock; ErrSyncBusy if another replica holds it.
func (s *Service) SyncNow(ctx context.Context, full bool, progress Progress) (SyncStats, error) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.store == nil {
		return s.syncDirect(ctx, progress)
	}
	if s.leading.Load() {
		return s.syncLocked(ctx, full, progress) // Run holds the lock
	}
	release, ok, err := s.store.Lock(ctx)
	if err != nil {
		return SyncStats{}, err
	}
	if !ok {
		return SyncStats{}, ErrSyncBusy
	}
	defer release()
	return s.syncLocked(ctx, full, progress)
}

// ErrSyncBusy says another replica is syncing.
var ErrSyncBusy = errors.New("placement sync: another replica holds the sync lock")

func (s *Service) syncLocked(ctx context.Context, full bool, progress Progress) (SyncStats, error) {
	st, err := s.syncer.Sync(ctx, full, progress)
	if err != nil {
		return st, err
	}
	if err := s.store.MarkSynced(ctx, full, st.Providers, s.cfg.Replica); err != nil {
		return st, err
	}
	s.log.Info("placement sync done", logkey.Full, full, logkey.Providers, st.Providers, logkey.Changed, st.Fetched,
		logkey.Removed, st.Removed, logkey.Duration, st.Duration)
	return st, nil
}

// syncDirect fills the index from Placement without a mirror.
func (s *Service) syncDirect(ctx context.Context, progress Progress) (SyncStats, error) {
	start := time.Now()
	refs, err := s.client.Providers(ctx, ListOpts{})
	if err != nil {
		return SyncStats{}, err
	}
	ps, err := s.syncer.fetchAll(ctx, refs, progress)
	if err != nil {
		return SyncStats{}, err
	}
	s.index.Load(ps)
	return SyncStats{Full: true, Providers: len(refs), Fetched: len(ps), GPUs: s.index.Len(), Duration: time.Since(start)}, nil
}

// Run keeps the index current until ctx ends: it loads the mirror, then
// either holds the sync lock and syncs (full at start and every
// FullSyncInterval, incremental every SyncInterval) or, while another
// replica holds it, follows the mirror's change notifications.
func (s *Service) Run(ctx context.Context) error {
	if s.store == nil {
		return s.runDirect(ctx)
	}
	fresh := s.loadMirror(ctx)
	go s.follow(ctx)
	for ; ctx.Err() == nil; fresh = false {
		release, ok, err := s.store.Lock(ctx)
		if err != nil {
			s.log.Warn("placement: sync lock", logkey.Err, err)
		}
		if ok {
			s.leading.Store(true)
			err = s.lead(ctx)
			s.leading.Store(false)
			release()
			if err != nil && ctx.Err() == nil {
				s.log.Warn("placement: sync loop stopped", logkey.Err, err)
			}
		}
		if ok || !fresh { // (loadMirror has just read the hosts table)
			s.refreshHosts(ctx)
		}
		wake.Wait(ctx, nil, s.cfg.SyncInterval)
	}
	return nil
}

// lead syncs while holding the lock.
func (s *Service) lead(ctx context.Context) error {
	lastFull := time.Time{}
	var b Backoff
	b.Base, b.Max = time.Second, s.cfg.SyncInterval
	for {
		full := lastFull.IsZero() || (s.cfg.FullSyncInterval > 0 && time.Since(lastFull) >= s.cfg.FullSyncInterval)
		s.syncMu.Lock()
		_, err := s.syncLocked(ctx, full, nil)
		s.syncMu.Unlock()
		s.refreshHosts(ctx)
		if s.cfg.AddTypeTraits && err == nil {
			if _, terr := s.AddTypeTraits(ctx); terr != nil && ctx.Err() == nil {
				s.log.Warn("placement: adding type traits", logkey.Err, terr)
			}
		}
		if len(s.cfg.OwnedGPUs) > 0 && err == nil {
			if _, perr := s.PublishOwned(ctx); perr != nil && ctx.Err() == nil {
				s.log.Warn("placement: bridge-owned GPUs", logkey.Err, perr)
			}
		}
		if err == nil { // also with none declared: the providers of GPUs taken out of the option go
			if _, _, rerr := s.RetireOwned(ctx); rerr != nil && ctx.Err() == nil {
				s.log.Warn("placement: undeclared bridge-owned GPUs", logkey.Err, rerr)
			}
		}
		if s.cfg.AddDriverTraits && err == nil {
			if _, terr := s.SyncDriverTraits(ctx); terr != nil && ctx.Err() == nil {
				s.log.Warn("placement: guest driver traits", logkey.Err, terr)
			}
		}
		if err == nil { // always on: a faulted GPU's provider carries the fault trait
			if _, terr := s.SyncFaultTraits(ctx); terr != nil && ctx.Err() == nil {
				s.log.Warn("placement: GPU fault traits", logkey.Err, terr)
			}
		}
		wait := s.cfg.SyncInterval
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("placement sync failed", logkey.Full, full, logkey.Err, err)
			wait = b.Next()
		} else if full {
			lastFull = time.Now()
			s.setSynced()
		}
		if !wake.Wait(ctx, nil, wait) {
			return nil
		}
	}
}

// follow applies the mirror's change notifications to the index.
func (s *Service) follow(ctx context.Context) {
	var b Backoff
	b.Base, b.Max = time.Second, 30*time.Second
	for ctx.Err() == nil {
		err := s.store.Listen(ctx, func(ids []string) {
			if ids == nil {
				if s.leading.Load() {
					return // our own sync batch: the index has it already
				}
				s.loadMirror(ctx)
				return
			}
			rs, err := s.store.Records(ctx, ids...)
			if err != nil {
				return
			}
			found := map[string]bool{}
			for _, r := range rs {
				found[r.UUID] = true
				s.index.ApplyRecord(r)
			}
			for _, id := range ids {
				if !found[id] {
					s.index.Remove(id)
				}
			}
		})
		if err != nil && ctx.Err() == nil {
			s.log.Warn("placement: mirror notifications", logkey.Err, err)
			b.Wait(ctx) //nolint:errcheck
		}
	}
}

func (s *Service) runDirect(ctx context.Context) error {
	for {
		if _, err := s.syncDirect(ctx, nil); err != nil && ctx.Err() == nil {
			s.log.Warn("placement sync failed", logkey.Err, err)
		} else if err == nil {
			s.setSynced()
		}
		if !wake.Wait(ctx, nil, s.cfg.SyncInterval) {
			return nil
		}
	}
}

// loadMirror loads the whole mirror into the index, and reads the hosts
// table (it reports whether it did); once the mirror holds a full sync,
// the index is ready for decisions.
func (s *Service) loadMirror(ctx context.Context) bool {
	st, stErr := s.store.State(ctx)
	all, err := s.store.Records(ctx)
	if err != nil {
		s.log.Warn("placement: cannot load mirror", logkey.Err, err)
		return false
	}
	s.index.LoadRecords(all)
	// The host ↔ node map before readiness: a decision for a named host
	// made before it would find no GPU there.
	s.refreshHosts(ctx)
	if stErr == nil && st.LastFullAt != nil {
		s.setSynced()
	}
	return true
}

// setSynced records that the index holds the result of a full sync.
func (s *Service) setSynced() {
	s.synced.Store(true)
	s.loadedOnce.Do(func() { close(s.loaded) })
}

// Loaded is closed once the index first holds the result of a full sync
// (Ready): the mirror's load at start, or this replica's first full sync,
// is over.
func (s *Service) Loaded() <-chan struct{} { return s.loaded }

// Ready reports whether decisions can be trusted: the index holds the
// result of a full inventory sync (by this replica or another). Before
// that every dry-run would answer "no capacity".
func (s *Service) Ready(context.Context) error {
	if !s.synced.Load() {
		return errors.New("the first full inventory sync from Placement has not finished")
	}
	return nil
}

// RefreshHosts re-reads the hosts table now (drains, Nova's disabled
// services, the host ↔ node map) instead of at the next sync round; the
// bridge calls it when an operator or Nova changes them. The types the
// agents' reports fix, which neither changes, wait for the next round.
func (s *Service) RefreshHosts(ctx context.Context) { s.readHosts(ctx) }

// refreshHosts reads the agents' host table: the compute host ↔ node
// mapping, which hosts and GPUs to exclude (drained, disabled, or with a
// report older than StaleReportAge), and the types the reports fix.
func (s *Service) refreshHosts(ctx context.Context) {
	if s.store == nil {
		return
	}
	s.readHosts(ctx)
	reported, err := readReportedTypes(ctx, s.store.Pool(), s.index.Len())
	if err != nil {
		s.log.Debug("placement: hosts' reports", logkey.Err, err)
		return
	}
	s.index.SetReportedTypes(reported)
}

// readHosts reads the compute host ↔ node mapping and which hosts and
// GPUs to exclude.
func (s *Service) readHosts(ctx context.Context) {
	if s.store == nil {
		return
	}
	pool := s.store.Pool()
	rows, err := pool.Query(ctx, `SELECT name, coalesce(node, name), (drained OR disabled OR (last_report_at IS NOT NULL AND last_report_at < now() - $1::interval)) FROM hosts`,
		fmt.Sprintf("%d seconds", int(s.cfg.StaleReportAge.Seconds())))
	if err != nil {
		s.log.Debug("placement: hosts table", logkey.Err, err)
		return
	}
	nodeOf, hostOf := map[string]string{}, map[string]string{}
	var ex []string
	for rows.Next() {
		var name, node string
		var bad bool
		if rows.Scan(&name, &node, &bad) != nil {
			continue
		}
		nodeOf[name], hostOf[node] = node, name
		if bad {
			ex = append(ex, node)
		}
	}
	rows.Close()
	var exg []string
	if rows, err := pool.Query(ctx, `SELECT provider_uuid::text FROM gpus WHERE drained`); err == nil {
		for rows.Next() {
			var u string
			if rows.Scan(&u) == nil {
				exg = append(exg, u)
			}
		}
		rows.Close()
	}
	s.exMu.Lock()
	s.nodeOf, s.hostOf, s.excludeHosts, s.excludeGPUs = nodeOf, hostOf, ex, exg
	s.exMu.Unlock()
}

// ReportedTypes are the vGPU types an agent's report fixes for its GPUs,
// by GPU provider name as Nova names it (node "_pci_" address) → type
// trait: the type of the vGPUs that exist on it, else the type the
// agent's allow-list (a copy of Nova's [devices] enabled_mdev_types)
// enables there, else the one type the agent offers there. A GPU offering
// several types, none in use and none enabled by name, is left out.
func ReportedTypes(node string, r protocol.Report) map[string]string {
	out := map[string]string{}
	for _, g := range r.GPUs {
		var active, offered string
		if len(g.Active) > 0 {
			active = g.Active[0].TypeID
		}
		if len(g.Types) > 0 {
			offered = g.Types[0].ID
		}
		if typ := reportedType(len(g.Active), active, g.EnabledType, len(g.Types), offered); len(typ) > 0 && g.PCI != "" {
			out[GPUProviderName(node, g.PCI)] = catalog.TraitFor(typ)
		}
	}
	return out
}

// reportedType is the type a report fixes for one GPU with active vGPUs,
// the first of type first, the type enabled on it, and types offered,
// the first offered: empty for none.
func reportedType[S string | []byte](active int, first, enabled S, types int, offered S) S {
	switch {
	case active > 0:
		return first
	case len(enabled) > 0:
		return enabled
	case types == 1:
		return offered
	}
	var none S
	return none
}

var pciUnderscores = strings.NewReplacer(":", "_", ".", "_")

// GPUProviderName is the name Nova gives the resource provider of the GPU
// at PCI address pci on node: node_pci_0000_3b_00_0.
func GPUProviderName(node, pci string) string {
	return node + "_pci_" + pciUnderscores.Replace(pci)
}

// reportedTypesSQL reads, for each GPU of each host's last report, what
// ReportedTypes reads of it (and nothing else): the host's node (the
// report's, else the row's), the GPU's address, its active vGPUs (how
// many, the first one's type) and the types it offers (how many, the
// first one's id). A fleet's reports are tens of MB of JSON, read every
// sync round; Postgres picks these fields out of its binary jsonb instead
// of sending the reports to be parsed here. (A report that is not what
// protocol.Report marshals to yields the fields it has.)
const reportedTypesSQL = `SELECT coalesce(nullif(h.report->>'node', ''), h.node, h.name), coalesce(g->>'pci', ''),
	coalesce(jsonb_array_length(CASE jsonb_typeof(g->'active') WHEN 'array' THEN g->'active' END), 0),
	coalesce(g->'active'->0->>'type_id', ''),
	coalesce(jsonb_array_length(CASE jsonb_typeof(g->'types') WHEN 'array' THEN g->'types' END), 0),
	coalesce(g->'types'->0->>'id', ''),
	coalesce(g->>'enabled_type', '')
FROM hosts h CROSS JOIN LATERAL jsonb_array_elements(CASE jsonb_typeof(h.report->'gpus') WHEN 'array' THEN h.report->'gpus' ELSE '[]' END) AS g
WHERE h.report IS NOT NULL`

// ReadReportedTypes reads ReportedTypes of every host's last report (of
// the report's node, else the hosts row's), as Index.SetReportedTypes
// takes them.
func ReadReportedTypes(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	return readReportedTypes(ctx, pool, 0)
}

// readReportedTypes is ReadReportedTypes expecting about n GPUs.
func readReportedTypes(ctx context.Context, pool *pgxpool.Pool, n int) (map[string]string, error) {
	rows, err := pool.Query(ctx, reportedTypesSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out, traits := make(map[string]string, n), map[string]string{}
	trait := func(typ []byte) string { // one string per type
		t, ok := traits[string(typ)]
		if !ok {
			t = catalog.TraitFor(string(typ))
			traits[string(typ)] = t
		}
		return t
	}
	// (scanned where the driver holds them: valid until the next row)
	var node, pci, active, offered, enabled pgtype.DriverBytes
	var nActive, nTypes int
	var name []byte
	scan := []any{&node, &pci, &nActive, &active, &nTypes, &offered, &enabled}
	for rows.Next() {
		if err := rows.Scan(scan...); err != nil {
			return nil, err
		}
		typ := reportedType(nActive, []byte(active), []byte(enabled), nTypes, []byte(offered))
		if len(typ) == 0 || len(pci) == 0 {
			continue
		}
		name = append(append(append(name[:0], node...), "_pci_"...), pci...)
		for i, c := range name[len(name)-len(pci):] {
			if c == ':' || c == '.' {
				name[len(name)-len(pci)+i] = '_'
			}
		}
		out[string(name)] = trait(typ)
	}
	return out, rows.Err()
}

// decide runs the engine with the current exclusions added.
func (s *Service) decide(q engine.Request) ([]engine.Candidate, error) {
	s.exMu.RLock()
	q.ExcludeHosts = append(append([]string(nil), q.ExcludeHosts...), s.excludeHosts...)
	q.ExcludeGPUs = append(append([]string(nil), q.ExcludeGPUs...), s.excludeGPUs...)
	q.Hosts = append([]string(nil), q.Hosts...)
	for i, h := range q.Hosts {
		if n, ok := s.nodeOf[h]; ok {
			q.Hosts[i] = n
		}
	}
	s.exMu.RUnlock()
	return s.index.Decide(s.engine, q)
}

// Placeable reports whether the bridge may place vGPUs on the node (a
// root provider's name): a host whose agent has reported (the hosts
// table knows it) and that is not drained, disabled or silent for longer
// than StaleReportAge. Without a database every node is placeable.
func (s *Service) Placeable(node string) bool {
	if s.store == nil {
		return true
	}
	s.exMu.RLock()
	defer s.exMu.RUnlock()
	if _, ok := s.hostOf[node]; !ok {
		return false
	}
	return !slices.Contains(s.excludeHosts, node)
}

// HostName maps a node (root provider name) to its compute service host,
// as agents report it; the node itself while unknown.
func (s *Service) HostName(node string) string { return s.hostName(node) }

// ProfileName names the profile of a type trait ("" when unknown).
func (s *Service) ProfileName(trait string) string { return s.profileName(trait) }

func (s *Service) hostName(node string) string {
	s.exMu.RLock()
	defer s.exMu.RUnlock()
	if h, ok := s.hostOf[node]; ok {
		return h
	}
	return node
}

// DryRunRequest is the body of POST /v1/placements/dry-run.
type DryRunRequest struct {
	Profile string `json:"profile,omitempty"`
	Traits  struct {
		Required  []string `json:"required,omitempty"`
		Forbidden []string `json:"forbidden,omitempty"`
	} `json:"traits,omitempty"`
	Count       int      `json:"count,omitempty"`
	Host        string   `json:"host,omitempty"`
	Strategy    string   `json:"strategy,omitempty"`
	AllowRetype bool     `json:"allow_retype,omitempty"`
	Limit       int      `json:"limit,omitempty"`
	ExcludeGPUs []string `json:"exclude_gpus,omitempty"`
}

// DryRunCandidate is one answer of a dry run.
type DryRunCandidate struct {
	Host         string `json:"host"`
	Node         string `json:"node"`
	ProviderUUID string `json:"provider_uuid"`
	PCIAddress   string `json:"pci_address,omitempty"`
	Profile      string `json:"profile,omitempty"`
	Trait        string `json:"trait,omitempty"`
	Amount       int    `json:"amount"`
	FreeAfter    int    `json:"free_after"`
	NeedsRetype  bool   `json:"needs_retype"`
	RetypeFrom   string `json:"retype_from,omitempty"`
	Reason       string `json:"reason"`
	// NovaConf is, for a needs_retype answer on a Nova-owned mdev GPU,
	// the nova.conf change of its host that re-types it (ExplainRetypes),
	// and RetypeCommand the vgpuctl command that applies it with drain
	// and verify.
	NovaConf      *novaconf.Change `json:"nova_conf_change,omitempty"`
	RetypeCommand string           `json:"retype_command,omitempty"`
	// Mode is "mixed" for a mixed bridge-owned GPU (MixedDryRun): Amount
	// counts vGPUs, FramebufferMiB is the MiB of framebuffer they take and
	// FreeAfter the MiB left after; "" (single) otherwise.
	Mode           string `json:"mode,omitempty"`
	FramebufferMiB int    `json:"framebuffer_mib,omitempty"`
}

// ModeMixed is DryRunCandidate.Mode of a mixed bridge-owned GPU.
const ModeMixed = "mixed"

// DryRunResponse is the answer of a dry run.
type DryRunResponse struct {
	Candidates []DryRunCandidate `json:"candidates"`
	// Rejected are the mixed bridge-owned GPUs that offer the requested
	// type but cannot take the request now, Reason saying why
	// (MixedDryRun).
	Rejected []DryRunCandidate `json:"rejected,omitempty"`
}

// ErrUnknownProfile says a dry run named a profile the catalog lacks.
var ErrUnknownProfile = errors.New("unknown vGPU profile")

// Request turns a dry-run body into an engine request.
func (s *Service) Request(d DryRunRequest) (engine.Request, error) {
	q := engine.Request{
		Required:    append([]string(nil), d.Traits.Required...),
		Forbidden:   append([]string(nil), d.Traits.Forbidden...),
		Count:       d.Count,
		Strategy:    engine.Strategy(strings.ToLower(d.Strategy)),
		AllowRetype: d.AllowRetype,
		Limit:       d.Limit,
		ExcludeGPUs: d.ExcludeGPUs,
	}
	if d.Host != "" {
		q.Hosts = []string{d.Host}
	}
	if d.Profile != "" {
		if s.catalog == nil {
			return q, fmt.Errorf("%w %q: no catalog", ErrUnknownProfile, d.Profile)
		}
		p, ok := s.catalog.ByName(d.Profile)
		if !ok || p.Trait == "" {
			return q, fmt.Errorf("%w %q", ErrUnknownProfile, d.Profile)
		}
		q.Required = append(q.Required, p.Trait)
	}
	return s.engine.Normalize(q)
}

// DryRun ranks candidates without claiming.
func (s *Service) DryRun(d DryRunRequest) (DryRunResponse, error) {
	q, err := s.Request(d)
	if err != nil {
		return DryRunResponse{}, err
	}
	cs, err := s.decide(q)
	if err != nil {
		return DryRunResponse{}, err
	}
	out := DryRunResponse{Candidates: make([]DryRunCandidate, 0, len(cs))}
	for _, c := range cs {
		dc := DryRunCandidate{
			Host:         s.hostName(c.GPU.Host.Name),
			Node:         c.GPU.Host.Name,
			ProviderUUID: c.GPU.UUID,
			PCIAddress:   c.GPU.PCIAddress(),
			Amount:       q.Count,
			FreeAfter:    c.FreeAfter,
			NeedsRetype:  c.NeedsRetype,
			RetypeFrom:   c.RetypeFrom,
			Reason:       c.Reason,
		}
		if len(c.GPU.Types) > 0 {
			dc.Trait = c.GPU.Types[0]
		}
		for _, t := range q.Required {
			if s.engine.IsType(t) {
				dc.Trait = t // what it serves, or would after re-typing
			}
		}
		dc.Profile = s.profileName(dc.Trait)
		out.Candidates = append(out.Candidates, dc)
	}
	return out, nil
}
