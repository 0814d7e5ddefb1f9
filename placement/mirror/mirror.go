// Package mirror keeps Placement's resource providers in Postgres (tables
// placement_*, migration 00003) and reads them back to rebuild the index.
// Writers notify readers on the channel Channel with the changed provider
// UUIDs, so every bridge replica keeps its index current.
package mirror

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unique"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
)

// Channel is the LISTEN/NOTIFY channel of mirror changes. The payload is
// a JSON array of provider UUIDs, or "*" for "reload everything".
const Channel = "vgpu_placement_mirror"

// LockKey is the advisory lock that makes one syncer active across replicas.
const LockKey int64 = 0x7667707573796e63 // "vgpusync"

// Store reads and writes the mirror.
type Store struct {
	pool       *pgxpool.Pool
	typePrefix string
	classes    []string
	classTypes map[string]string // class → numeric type id (Nova-owned VF GPUs)
}

// WithClassTypes types the GPUs of the given classes that carry no type
// trait (class → type id, [placement] nova_vf_resource_classes) in the
// gpus table, and returns s.
func (s *Store) WithClassTypes(m map[string]string) *Store {
	s.classTypes = m
	return s
}

// New returns a store on pool. classes are the vGPU resource classes and
// typePrefix the vGPU type trait prefix, used to keep the gpus table.
func New(pool *pgxpool.Pool, classes []string, typePrefix string) *Store {
	if len(classes) == 0 {
		classes = []string{"VGPU"}
	}
	if typePrefix == "" {
		typePrefix = engine.DefaultTypePrefix
	}
	return &Store{pool: pool, classes: classes, typePrefix: typePrefix}
}

// Pool returns the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ref is what the mirror holds of a provider's identity.
type Ref struct {
	Name       string
	Generation int
	ParentUUID string
	RootUUID   string
}

// Refs returns every mirrored provider's name, generation and tree.
func (s *Store) Refs(ctx context.Context) (map[string]Ref, error) {
	rows, err := s.pool.Query(ctx, `SELECT uuid::text, name, generation, coalesce(parent_uuid::text, ''), root_uuid::text FROM placement_providers`)
	if err != nil {
		return nil, fmt.Errorf("mirror generations: %w", err)
	}
	out := map[string]Ref{}
	var u string
	var r Ref
	_, err = pgx.ForEachRow(rows, []any{&u, &r.Name, &r.Generation, &r.ParentUUID, &r.RootUUID}, func() error { out[u] = r; return nil })
	if err != nil {
		return nil, fmt.Errorf("mirror generations: %w", err)
	}
	return out, nil
}

// Put writes providers (replacing what was mirrored for them) and deletes
// the providers in gone, in one transaction, then notifies readers.
func (s *Store) Put(ctx context.Context, ps []engine.Provider, gone []string) error {
	if len(ps) == 0 && len(gone) == 0 {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("mirror put: %w", err)
	}
	defer tx.Rollback(ctx)
	ids := make([]string, 0, len(ps)+len(gone))
	for _, p := range ps {
		ids = append(ids, p.UUID)
	}
	ids = append(ids, gone...)
	// Children first (FK cascade does it for deletes; for upserts we
	// replace the child rows wholesale).
	for _, t := range []string{"placement_inventories", "placement_traits", "placement_usages", "placement_aggregates", "placement_allocations"} {
		if _, err := tx.Exec(ctx, `DELETE FROM `+t+` WHERE provider_uuid = ANY($1::uuid[])`, ids); err != nil {
			return fmt.Errorf("mirror put: clear %s: %w", t, err)
		}
	}
	if len(gone) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM placement_providers WHERE uuid = ANY($1::uuid[])`, gone); err != nil {
			return fmt.Errorf("mirror put: delete providers: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM gpus WHERE provider_uuid = ANY($1::uuid[])`, gone); err != nil {
			return fmt.Errorf("mirror put: delete gpus: %w", err)
		}
	}
	if len(ps) > 0 {
		if err := s.insert(ctx, tx, ps); err != nil {
			return fmt.Errorf("mirror put: %w", err)
		}
	}
	if err := notify(ctx, tx, ids); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func notify(ctx context.Context, tx pgx.Tx, ids []string) error {
	payload := "*"
	if b, _ := json.Marshal(ids); len(b) < 7900 {
		payload = string(b)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, Channel, payload); err != nil {
		return fmt.Errorf("mirror notify: %w", err)
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (s *Store) insert(ctx context.Context, tx pgx.Tx, ps []engine.Provider) error {
	var (
		uu, names, parents, roots []*string
		gens                      []int64
	)
	var iu, ic []string
	var it, ir, imin, imax, istep []int64
	var iratio []float64
	var tu, tt []string
	var uu2, uc []string
	var uused []int64
	var au, aa []string
	var lu, lc, lrc []string
	var lused []int64
	var gu, groot, gpci, gtype, gclass []string
	var ggen []int64
	for i := range ps {
		p := &ps[i]
		root := p.RootUUID
		if root == "" {
			root = p.UUID
		}
		uuid, name := p.UUID, p.Name
		uu = append(uu, &uuid)
		names = append(names, &name)
		parents = append(parents, nullable(p.ParentUUID))
		roots = append(roots, &root)
		gens = append(gens, int64(p.Generation))
		for c, inv := range p.Inventory {
			iu, ic = append(iu, p.UUID), append(ic, c)
			it, ir = append(it, int64(inv.Total)), append(ir, int64(inv.Reserved))
			imin, imax, istep = append(imin, int64(inv.MinUnit)), append(imax, int64(inv.MaxUnit)), append(istep, int64(inv.StepSize))
			iratio = append(iratio, inv.AllocationRatio)
		}
		for _, t := range p.Traits {
			tu, tt = append(tu, p.UUID), append(tt, t)
		}
		for c, n := range p.Usages {
			uu2, uc, uused = append(uu2, p.UUID), append(uc, c), append(uused, int64(n))
		}
		for _, a := range p.Aggregates {
			au, aa = append(au, p.UUID), append(aa, a)
		}
		for con, res := range p.Allocations {
			for c, n := range res {
				lu, lc, lrc, lused = append(lu, p.UUID), append(lc, con), append(lrc, c), append(lused, int64(n))
			}
		}
		if class := s.class(p); class != "" {
			gu = append(gu, p.UUID)
			groot = append(groot, root)
			gpci = append(gpci, engine.PCIAddress(p.Name))
			typ := s.typeID(p.Traits)
			if typ == "" {
				typ = s.classTypes[class]
			}
			gtype = append(gtype, typ)
			gclass = append(gclass, class)
			ggen = append(ggen, int64(p.Generation))
		}
	}
	if _, err := tx.Exec(ctx, `
INSERT INTO placement_providers (uuid, name, generation, parent_uuid, root_uuid, synced_at)
SELECT u, n, g, p, r, now() FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::uuid[], $5::uuid[]) AS x(u, n, g, p, r)
ON CONFLICT (uuid) DO UPDATE SET name = excluded.name, generation = excluded.generation,
    parent_uuid = excluded.parent_uuid, root_uuid = excluded.root_uuid, synced_at = excluded.synced_at`,
		uu, names, gens, parents, roots); err != nil {
		return fmt.Errorf("providers: %w", err)
	}
	if len(iu) > 0 {
		if _, err := tx.Exec(ctx, `
INSERT INTO placement_inventories (provider_uuid, resource_class, total, reserved, min_unit, max_unit, step_size, allocation_ratio)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::float8[])`,
			iu, ic, it, ir, imin, imax, istep, iratio); err != nil {
			return fmt.Errorf("inventories: %w", err)
		}
	}
	if len(tu) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO placement_traits SELECT * FROM unnest($1::uuid[], $2::text[])`, tu, tt); err != nil {
			return fmt.Errorf("traits: %w", err)
		}
	}
	if len(uu2) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO placement_usages SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[])`, uu2, uc, uused); err != nil {
			return fmt.Errorf("usages: %w", err)
		}
	}
	if len(au) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO placement_aggregates SELECT * FROM unnest($1::uuid[], $2::uuid[])`, au, aa); err != nil {
			return fmt.Errorf("aggregates: %w", err)
		}
	}
	if len(lu) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO placement_allocations SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[])`, lu, lc, lrc, lused); err != nil {
			return fmt.Errorf("allocations: %w", err)
		}
	}
	if len(gu) > 0 {
		if _, err := tx.Exec(ctx, `
INSERT INTO gpus (provider_uuid, node, pci_address, vgpu_type, resource_class, generation, updated_at)
SELECT u, (SELECT name FROM placement_providers WHERE uuid = r), nullif(p, ''), nullif(t, ''), c, g, now()
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::bigint[]) AS x(u, r, p, t, c, g)
ON CONFLICT (provider_uuid) DO UPDATE SET node = coalesce(excluded.node, gpus.node), pci_address = excluded.pci_address,
    vgpu_type = excluded.vgpu_type, resource_class = excluded.resource_class, generation = excluded.generation, updated_at = now()`,
			gu, groot, gpci, gtype, gclass, ggen); err != nil {
			return fmt.Errorf("gpus: %w", err)
		}
	}
	return nil
}

func (s *Store) class(p *engine.Provider) string {
	for _, c := range s.classes {
		if _, ok := p.Inventory[c]; ok {
			return c
		}
	}
	return ""
}

// typeID turns the first type trait back into a type id:
// CUSTOM_NVIDIA_232 → nvidia-232.
func (s *Store) typeID(traits []string) string {
	for _, t := range traits {
		if strings.HasPrefix(t, s.typePrefix) {
			return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(t, "CUSTOM_")), "_", "-")
		}
	}
	return ""
}

// SetAllocation records at once what a claim or release changed on one
// provider: the consumer's amounts of class (0 removes it), the provider's
// new usage of class and its new generation.
//
// It runs on a claim's critical path, so it is one statement (one round
// trip) and its commit does not wait for the WAL flush
// (synchronous_commit off for this transaction only). That is safe
// because the mirror is a copy of Placement: a write lost to a Postgres
// crash leaves the provider's mirrored generation behind Placement's, and
// the next incremental sync reads it again. The next durable commit on the
// server flushes it anyway.
func (s *Store) SetAllocation(ctx context.Context, provider, consumer, class string, amount, used, generation int) error {
	payload, _ := json.Marshal([]string{provider})
	_, err := s.pool.Exec(ctx, setAllocationSQL, provider, generation, consumer, class, amount, used, Channel, string(payload))
	if err != nil {
		return fmt.Errorf("mirror allocation: %w", err)
	}
	return nil
}

// setAllocationSQL is SetAllocation's statement. Every data-modifying
// part runs once whether or not the final SELECT reads it; each acts only
// when the provider is mirrored (p is not empty), so a provider the
// mirror does not hold yet is left to the next sync.
const setAllocationSQL = `WITH
  nosync AS (SELECT set_config('synchronous_commit', 'off', true)),
  p AS (UPDATE placement_providers SET generation = greatest(generation, $2::bigint) WHERE uuid = $1::uuid RETURNING uuid),
  upd AS (INSERT INTO placement_allocations SELECT uuid, $3::uuid, $4::text, $5::bigint FROM p WHERE $5::bigint > 0
    ON CONFLICT (provider_uuid, consumer_uuid, resource_class) DO UPDATE SET used = excluded.used),
  del AS (DELETE FROM placement_allocations a USING p
    WHERE $5::bigint <= 0 AND a.provider_uuid = p.uuid AND a.consumer_uuid = $3::uuid AND a.resource_class = $4::text),
  u AS (INSERT INTO placement_usages SELECT uuid, $4::text, $6::bigint FROM p
    ON CONFLICT (provider_uuid, resource_class) DO UPDATE SET used = excluded.used)
SELECT pg_notify($7::text, $8::text) FROM p, nosync`

// MarkSynced records a finished sync.
func (s *Store) MarkSynced(ctx context.Context, full bool, providers int, syncer string) error {
	q := `UPDATE placement_sync_state SET last_sync_at = now(), providers = $1, syncer = $2 WHERE id = 1`
	if full {
		q = `UPDATE placement_sync_state SET last_sync_at = now(), last_full_at = now(), providers = $1, syncer = $2 WHERE id = 1`
	}
	if _, err := s.pool.Exec(ctx, q, providers, syncer); err != nil {
		return fmt.Errorf("mirror sync state: %w", err)
	}
	return nil
}

// SyncState is where the syncer stands.
type SyncState struct {
	LastFullAt, LastSyncAt *time.Time
	Providers              int
	Syncer                 string
}

// State reads the sync state.
func (s *Store) State(ctx context.Context) (SyncState, error) {
	var st SyncState
	var syncer *string
	err := s.pool.QueryRow(ctx, `SELECT last_full_at, last_sync_at, providers, syncer FROM placement_sync_state WHERE id = 1`).
		Scan(&st.LastFullAt, &st.LastSyncAt, &st.Providers, &syncer)
	if syncer != nil {
		st.Syncer = *syncer
	}
	if err != nil {
		return st, fmt.Errorf("mirror sync state: %w", err)
	}
	return st, nil
}

// Load reads providers back: all of them when uuids is empty.
func (s *Store) Load(ctx context.Context, uuids ...string) ([]engine.Provider, error) {
	where, args := "", []any{}
	if len(uuids) > 0 {
		where, args = " WHERE provider_uuid = ANY($1::uuid[])", []any{uuids}
	}
	pwhere := strings.Replace(where, "provider_uuid", "uuid", 1)
	byID := map[string]*engine.Provider{}
	var order []string
	rows, err := s.pool.Query(ctx, `SELECT uuid::text, name, generation, coalesce(parent_uuid::text, ''), root_uuid::text FROM placement_providers`+pwhere+` ORDER BY uuid`, args...)
	if err != nil {
		return nil, fmt.Errorf("mirror load: %w", err)
	}
	var p engine.Provider
	if _, err := pgx.ForEachRow(rows, []any{&p.UUID, &p.Name, &p.Generation, &p.ParentUUID, &p.RootUUID}, func() error {
		c := p
		byID[c.UUID] = &c
		order = append(order, c.UUID)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("mirror load providers: %w", err)
	}
	each := func(q string, scan []any, fn func()) error {
		rows, err := s.pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, scan, func() error { fn(); return nil })
		return err
	}
	// One copy of each resource class, trait and aggregate name: a fleet's
	// providers share a few dozen, and each scanned row is a string of its
	// own (with 10,000 compute nodes of 30 traits each, 300,000 copies kept
	// by the index).
	intern := func(s string) string { return unique.Make(s).Value() }
	var u, c, t string
	var inv engine.Inventory
	var n int
	if err := each(`SELECT provider_uuid::text, resource_class, total, reserved, min_unit, max_unit, step_size, allocation_ratio FROM placement_inventories`+where,
		[]any{&u, &c, &inv.Total, &inv.Reserved, &inv.MinUnit, &inv.MaxUnit, &inv.StepSize, &inv.AllocationRatio}, func() {
			if p := byID[u]; p != nil {
				if p.Inventory == nil {
					p.Inventory = map[string]engine.Inventory{}
				}
				p.Inventory[intern(c)] = inv
			}
		}); err != nil {
		return nil, fmt.Errorf("mirror load inventories: %w", err)
	}
	if err := each(`SELECT provider_uuid::text, trait FROM placement_traits`+where+` ORDER BY provider_uuid, trait`, []any{&u, &t}, func() {
		if p := byID[u]; p != nil {
			p.Traits = append(p.Traits, intern(t))
		}
	}); err != nil {
		return nil, fmt.Errorf("mirror load traits: %w", err)
	}
	if err := each(`SELECT provider_uuid::text, resource_class, used FROM placement_usages`+where, []any{&u, &c, &n}, func() {
		if p := byID[u]; p != nil {
			if p.Usages == nil {
				p.Usages = map[string]int{}
			}
			p.Usages[intern(c)] = n
		}
	}); err != nil {
		return nil, fmt.Errorf("mirror load usages: %w", err)
	}
	if err := each(`SELECT provider_uuid::text, aggregate_uuid::text FROM placement_aggregates`+where+` ORDER BY 1, 2`, []any{&u, &t}, func() {
		if p := byID[u]; p != nil {
			p.Aggregates = append(p.Aggregates, intern(t))
		}
	}); err != nil {
		return nil, fmt.Errorf("mirror load aggregates: %w", err)
	}
	if err := each(`SELECT provider_uuid::text, consumer_uuid::text, resource_class, used FROM placement_allocations`+where, []any{&u, &t, &c, &n}, func() {
		if p := byID[u]; p != nil {
			if p.Allocations == nil {
				p.Allocations = map[string]map[string]int{}
			}
			if p.Allocations[t] == nil {
				p.Allocations[t] = map[string]int{}
			}
			p.Allocations[t][intern(c)] = n
		}
	}); err != nil {
		return nil, fmt.Errorf("mirror load allocations: %w", err)
	}
	out := make([]engine.Provider, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	return out, nil
}

// Records reads providers back as the index keeps them (all of them when
// uuids is empty): index.Load's input without what the index does not
// read. Store.Load builds each provider's maps (inventories, usages, its
// allocations, one map per consumer) and its aggregates, which for a
// fleet of 10,000 hosts × 8 GPUs is most of the memory a load takes, only
// for the index to drop them. Records reads only the inventory and usage
// of the store's vGPU classes, no aggregates nor allocations, and scans
// without a copy what it does not keep: a provider's uuid and name are one
// string, a child's root uuid is its root's string, the names of traits
// and classes one copy each, and hosts or GPUs with the same traits share
// one slice (index.TraitSets).
func (s *Store) Records(ctx context.Context, uuids ...string) ([]index.Record, error) {
	// Of some providers: $1, the uuids. The vGPU classes follow.
	var args []any
	where, and := "", ""
	if len(uuids) > 0 {
		args = []any{uuids}
		where, and = " WHERE uuid = ANY($1::uuid[])", " AND provider_uuid = ANY($1::uuid[])"
	}
	classArgs := append(slices.Clip(args), s.classes)
	classes := fmt.Sprintf("$%d::text[]", len(classArgs))
	var (
		ids   [][16]byte // of recs, ascending
		roots [][16]byte // recs' roots
		recs  []index.Record
		id    [16]byte
		root  [16]byte
		name  pgtype.DriverBytes
		gen   int
		text  []byte
	)
	// The slices at their size at once (not grown by copies: a fleet's
	// records are tens of MB).
	n := len(uuids)
	if n == 0 {
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM placement_providers`).Scan(&n); err != nil {
			return nil, fmt.Errorf("mirror records: %w", err)
		}
	}
	ids, roots, recs = make([][16]byte, 0, n), make([][16]byte, 0, n), make([]index.Record, 0, n)
	rows, err := s.pool.Query(ctx, `SELECT uuid, name, generation, root_uuid FROM placement_providers`+where+` ORDER BY uuid`, args...)
	if err != nil {
		return nil, fmt.Errorf("mirror records: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &name, &gen, &root}, func() error {
		// The uuid's text and the name in one string.
		text = append(uuidText(text[:0], id), name...)
		both := string(text)
		ids, roots = append(ids, id), append(roots, root)
		recs = append(recs, index.Record{UUID: both[:36], Name: both[36:], Generation: gen})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("mirror records: providers: %w", err)
	}
	if !slices.IsSortedFunc(ids, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) }) {
		sort.Sort(byID{ids, roots, recs}) // (Postgres orders uuids by their bytes)
	}
	find := func(id [16]byte) *index.Record {
		i, ok := slices.BinarySearchFunc(ids, id, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
		if !ok {
			return nil
		}
		return &recs[i]
	}
	for i := range recs {
		if r := find(roots[i]); r != nil {
			recs[i].RootUUID = r.UUID
		} else {
			recs[i].RootUUID = string(uuidText(nil, roots[i]))
		}
	}

	// One copy of each trait and resource class name (a scanned string
	// would be one per row), and of each set of traits.
	names := map[string]string{}
	intern := func(b []byte) string {
		if v, ok := names[string(b)]; ok {
			return v
		}
		v := string(b)
		names[v] = v
		return v
	}
	var sets index.TraitSets
	var cur *index.Record
	var buf []string
	flush := func() {
		if cur != nil {
			cur.Traits = sets.Intern(buf)
		}
		buf = buf[:0]
	}
	var trait pgtype.DriverBytes
	var last [16]byte
	rows, err = s.pool.Query(ctx, `SELECT provider_uuid, trait FROM placement_traits WHERE true`+and+
		` ORDER BY provider_uuid, trait COLLATE "C"`, args...)
	if err != nil {
		return nil, fmt.Errorf("mirror records: traits: %w", err)
	}
	first := true
	if _, err := pgx.ForEachRow(rows, []any{&id, &trait}, func() error {
		if first || id != last {
			flush()
			cur, last, first = find(id), id, false
		}
		buf = append(buf, intern(trait))
		return nil
	}); err != nil {
		return nil, fmt.Errorf("mirror records: traits: %w", err)
	}
	flush()

	// The inventory of the first vGPU class a provider has, then its usage.
	rank := func(b []byte) int {
		for i, c := range s.classes {
			if string(b) == c {
				return i
			}
		}
		return -1
	}
	var rc pgtype.DriverBytes
	var inv engine.Inventory
	rows, err = s.pool.Query(ctx, `SELECT provider_uuid, resource_class, total, reserved, min_unit, max_unit, step_size, allocation_ratio
		FROM placement_inventories WHERE resource_class = ANY(`+classes+`)`+and, classArgs...)
	if err != nil {
		return nil, fmt.Errorf("mirror records: inventories: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &rc, &inv.Total, &inv.Reserved, &inv.MinUnit, &inv.MaxUnit, &inv.StepSize, &inv.AllocationRatio}, func() error {
		r, k := find(id), rank(rc)
		if r == nil || k < 0 {
			return nil
		}
		if r.Class == "" || k < slices.Index(s.classes, r.Class) {
			r.Class, r.Inventory = s.classes[k], inv
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("mirror records: inventories: %w", err)
	}
	var used int
	rows, err = s.pool.Query(ctx, `SELECT provider_uuid, resource_class, used FROM placement_usages WHERE resource_class = ANY(`+classes+`)`+and, classArgs...)
	if err != nil {
		return nil, fmt.Errorf("mirror records: usages: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &rc, &used}, func() error {
		if r := find(id); r != nil && r.Class != "" && string(rc) == r.Class {
			r.Used = used
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("mirror records: usages: %w", err)
	}
	return recs, nil
}

// uuidText appends the canonical text of a uuid to b.
func uuidText(b []byte, id [16]byte) []byte {
	b = hex.AppendEncode(b, id[:4])
	b = append(b, '-')
	b = hex.AppendEncode(b, id[4:6])
	b = append(b, '-')
	b = hex.AppendEncode(b, id[6:8])
	b = append(b, '-')
	b = hex.AppendEncode(b, id[8:10])
	b = append(b, '-')
	return hex.AppendEncode(b, id[10:])
}

// byID sorts Records' parallel slices by uuid.
type byID struct {
	ids, roots [][16]byte
	recs       []index.Record
}

func (b byID) Len() int           { return len(b.ids) }
func (b byID) Less(i, j int) bool { return bytes.Compare(b.ids[i][:], b.ids[j][:]) < 0 }
func (b byID) Swap(i, j int) {
	b.ids[i], b.ids[j] = b.ids[j], b.ids[i]
	b.roots[i], b.roots[j] = b.roots[j], b.roots[i]
	b.recs[i], b.recs[j] = b.recs[j], b.recs[i]
}

// Allocation is one consumer's holding on one provider.
type Allocation struct {
	Consumer string `json:"consumer_uuid"`
	Provider string `json:"provider_uuid"`
	Class    string `json:"resource_class"`
	Used     int    `json:"used"`
}

// Allocations lists mirrored vGPU allocations, of one consumer when
// consumer is not empty.
func (s *Store) Allocations(ctx context.Context, consumer string) ([]Allocation, error) {
	return s.ProjectAllocations(ctx, consumer, "")
}

// ProjectAllocations is Allocations limited, when project is not empty,
// to the consumers that are instances of project (the instances the
// bridge knows from Nova's notifications).
func (s *Store) ProjectAllocations(ctx context.Context, consumer, project string) ([]Allocation, error) {
	q := `SELECT consumer_uuid::text, provider_uuid::text, resource_class, used FROM placement_allocations
		WHERE ($1 = '' OR consumer_uuid = NULLIF($1, '')::uuid)
		  AND ($2 = '' OR consumer_uuid IN (SELECT uuid FROM instances WHERE project_id = $2))`
	rows, err := s.pool.Query(ctx, q+` ORDER BY consumer_uuid, provider_uuid, resource_class`, consumer, project)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "22P02" {
			return nil, nil // not a uuid: nothing held
		}
		return nil, fmt.Errorf("mirror allocations: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Allocation])
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "22P02" {
			return nil, nil
		}
		return nil, fmt.Errorf("mirror allocations: %w", err)
	}
	return out, nil
}

// Listen calls fn with the changed provider UUIDs (nil: everything) for
// every notification, until ctx ends or the connection fails.
func (s *Store) Listen(ctx context.Context, fn func(uuids []string)) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("mirror listen: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN `+Channel); err != nil {
		return fmt.Errorf("mirror listen: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `UNLISTEN `+Channel) //nolint:errcheck
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("mirror listen: %w", err)
		}
		var ids []string
		if n.Payload != "*" {
			if json.Unmarshal([]byte(n.Payload), &ids) != nil {
				ids = nil
			}
		}
		fn(ids)
	}
}

// Lock tries to take the syncer's advisory lock on a connection of its
// own; the lock is held until release is called or the connection dies.
func (s *Store) Lock(ctx context.Context) (release func(), ok bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("sync lock: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, LockKey).Scan(&ok); err != nil {
		conn.Release()
		return nil, false, fmt.Errorf("sync lock: %w", err)
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return func() {
		_, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, LockKey)
		if err != nil {
			conn.Conn().Close(context.Background()) //nolint:errcheck // closing drops the lock
		}
		conn.Release()
	}, true, nil
}
