package pipeline

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/policystate"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Catalog is what the pipeline reads of the vGPU profile catalog.
type Catalog interface {
	ByName(name string) (catalog.Profile, bool)
	ByTypeID(typeID string) (catalog.Profile, bool)
	ByTrait(trait string) (catalog.Profile, bool)
}

// snapshot is the policy.State of one evaluation.
type snapshot struct {
	inst    policy.Instance
	hosts   []policy.Host
	byName  map[string]int
	usage   policy.Usage
	project string
	// limits are the project's unified limits (Deps.Limits); nil: none.
	limits []policy.UnifiedLimit
	// loadState is the policy's load state of the instance when
	// loadFacts read it with the facts (nil: Evaluate reads it).
	loadState *policy.Tracker
}

var _ policy.LimitState = (*snapshot)(nil)

// ProjectLimits implements policy.LimitState.
func (s *snapshot) ProjectLimits(id string) []policy.UnifiedLimit {
	if id == s.project {
		return s.limits
	}
	return nil
}

func (s *snapshot) Instance(id string) (policy.Instance, bool) {
	if id == "" || s.inst.UUID != id {
		return policy.Instance{}, false
	}
	return s.inst, true
}

func (s *snapshot) Host(name string) (policy.Host, bool) {
	if i, ok := s.byName[name]; ok {
		return s.hosts[i], true
	}
	return policy.Host{}, false
}

func (s *snapshot) Hosts() []policy.Host { return s.hosts }

func (s *snapshot) ProjectUsage(id string) policy.Usage {
	if id == s.project {
		return s.usage
	}
	return policy.Usage{}
}

// hostSet is the fleet as the agents' reports describe it.
type hostSet struct {
	hosts  []policy.Host
	byName map[string]int
	// guest is the NVIDIA driver each instance's guest loaded, as its
	// host's agent reports it (by instance UUID; one entry per vGPU of
	// the fleet, so keyed by the UUID's 16 bytes, not its text).
	guest map[uuid.UUID]string
	at    time.Time
	// kept is what the next refresh (refreshHosts) may keep of each host
	// whose hosts row has not changed since (by name).
	kept map[string]keptHost
}

// keptHost is one host of a view as its report was read: the hosts row's
// updated_at then, the policy's host and the guest drivers its report
// gave.
type keptHost struct {
	at     time.Time
	host   policy.Host
	guests []guestDriver
}

type guestDriver struct {
	instance uuid.UUID
	driver   string
}

// HostFromReport turns an agent's report into the policy's view of a
// host. It is pure; cat may be nil.
func HostFromReport(r protocol.Report, cat Catalog) policy.Host {
	hr := hostReport{Hypervisor: r.Hypervisor, DriverVersion: r.DriverVersion, GPUs: make([]reportGPU, len(r.GPUs))}
	for i, g := range r.GPUs {
		rg := reportGPU{PCI: g.PCI, Types: g.Types, UtilPercent: g.UtilPercent, Active: make([]reportVGPU, len(g.Active))}
		for j, v := range g.Active {
			rg.Active[j] = reportVGPU{TypeID: v.TypeID, InstanceUUID: v.InstanceUUID, GuestDriver: v.GuestDriver}
		}
		hr.GPUs[i] = rg
	}
	return newHostReader(cat).host(r.Host, &hr)
}

// hostReport is what the host view reads of an agent's report
// (protocol.Report): a fleet's reports are tens of MB of JSON, read again
// every HostsRefresh while events flow, and decoding only these fields
// leaves the rest unallocated.
type hostReport struct {
	Hypervisor    string      `json:"hypervisor"`
	DriverVersion string      `json:"driver_version"`
	GPUs          []reportGPU `json:"gpus"`
}

type reportGPU struct {
	PCI         string              `json:"pci"`
	Types       []protocol.VGPUType `json:"types"`
	Active      []reportVGPU        `json:"active"`
	UtilPercent *float64            `json:"util_percent"`
}

type reportVGPU struct {
	TypeID       string `json:"type_id"`
	InstanceUUID string `json:"instance_uuid"`
	GuestDriver  string `json:"guest_driver"`
}

// hostReader turns reports into policy hosts, keeping one string of each
// value that repeats across the fleet (addresses, models, profiles,
// versions) and parsing each profile name once.
type hostReader struct {
	cat     Catalog
	strs    map[string]string
	names   map[string]catalog.ParsedName // by type name; absent: not parsed yet
	invalid map[string]bool               // type names that do not parse
}

func newHostReader(cat Catalog) *hostReader {
	return &hostReader{cat: cat, strs: map[string]string{}, names: map[string]catalog.ParsedName{}, invalid: map[string]bool{}}
}

func (hr *hostReader) str(s string) string {
	if v, ok := hr.strs[s]; ok {
		return v
	}
	hr.strs[s] = s
	return s
}

func (hr *hostReader) parse(name string) (catalog.ParsedName, bool) {
	if pn, ok := hr.names[name]; ok {
		return pn, true
	}
	if hr.invalid[name] {
		return catalog.ParsedName{}, false
	}
	pn, err := catalog.ParseName(name)
	if err != nil {
		hr.invalid[name] = true
		return pn, false
	}
	pn.GPU, pn.Name = hr.str(pn.GPU), hr.str(pn.Name)
	hr.names[name] = pn
	return pn, true
}

// host is HostFromReport of the host name's report r.
func (hr *hostReader) host(name string, r *hostReport) policy.Host {
	h, _ := hr.hostCat(name, r)
	return h
}

// hostCat is host, and whether a profile of it came from the catalog
// (a type the report names without a name that parses), which may learn
// the type later: such a host is not kept from one refresh to the next.
func (hr *hostReader) hostCat(name string, r *hostReport) (policy.Host, bool) {
	fromCat := false
	// Agents before the hypervisor was reported ran libvirt's QEMU driver.
	h := policy.Host{Name: name, Hypervisor: hr.str(cmp.Or(r.Hypervisor, "KVM")), DriverVersion: hr.str(r.DriverVersion)}
	if len(r.GPUs) > 0 {
		h.GPUs = make([]policy.GPU, 0, len(r.GPUs))
	}
	for _, g := range r.GPUs {
		pg := policy.GPU{Address: hr.str(g.PCI), Used: len(g.Active)}
		for _, t := range g.Types {
			if pn, ok := hr.parse(t.Name); ok {
				pg.Model = pn.GPU
				break
			}
		}
		if len(g.Active) > 0 {
			typ := g.Active[0].TypeID
			for _, t := range g.Types {
				if t.ID == typ {
					pg.Capacity = t.MaxInstances
					if pn, ok := hr.parse(t.Name); ok {
						pg.Profile = pn.Name
					}
				}
			}
			if pg.Profile == "" && hr.cat != nil {
				fromCat = true
				if p, ok := hr.cat.ByTypeID(typ); ok {
					pg.Profile, pg.Capacity = p.Name, p.MaxInstances
				}
			}
		}
		if g.UtilPercent != nil {
			pg.Utilization = *g.UtilPercent
		}
		h.GPUs = append(h.GPUs, pg)
	}
	return h, fromCat
}

func loadHosts(ctx context.Context, q Querier, cat Catalog) (*hostSet, error) {
	rows, err := q.Query(ctx, `SELECT name, report FROM hosts WHERE report IS NOT NULL ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("read hosts: %w", err)
	}
	defer rows.Close()
	hs := &hostSet{byName: map[string]int{}, guest: map[uuid.UUID]string{}, at: time.Now()}
	hr := newHostReader(cat)
	var name string
	var raw pgtype.DriverBytes // valid until the next row: decoded, not copied
	scan := []any{&name, &raw}
	for rows.Next() {
		if err := rows.Scan(scan...); err != nil {
			return nil, fmt.Errorf("read hosts: %w", err)
		}
		hs.add(hr, name, raw)
	}
	return hs, rows.Err()
}

// refreshHosts reads the hosts' reports as loadHosts does, but decodes
// only those whose hosts row changed since prev read it (its updated_at,
// which every write of a report sets): the others are taken from prev.
// Most reports do not change between two refreshes of a busy pipeline
// (HostsRefresh), and decoding a fleet's reports was most of what a
// refresh cost the bridge (and their TOASTed JSON Postgres).
func refreshHosts(ctx context.Context, q Querier, cat Catalog, prev *hostSet) (*hostSet, error) {
	names, ats := make([]string, 0, len(prev.kept)), make([]time.Time, 0, len(prev.kept))
	for n, k := range prev.kept {
		names, ats = append(names, n), append(ats, k.at)
	}
	rows, err := q.Query(ctx, `SELECT h.name, h.updated_at, c.at IS DISTINCT FROM h.updated_at,
			CASE WHEN c.at IS DISTINCT FROM h.updated_at THEN h.report END
		FROM hosts h LEFT JOIN unnest($1::text[], $2::timestamptz[]) AS c(name, at) ON c.name = h.name
		WHERE h.report IS NOT NULL ORDER BY h.name`, names, ats)
	if err != nil {
		return nil, fmt.Errorf("read hosts: %w", err)
	}
	defer rows.Close()
	hs := &hostSet{byName: map[string]int{}, guest: map[uuid.UUID]string{}, at: time.Now(), kept: map[string]keptHost{}}
	hr := newHostReader(cat)
	var name string
	var at time.Time
	var changed bool
	var raw pgtype.DriverBytes // valid until the next row: decoded, not copied
	scan := []any{&name, &at, &changed, &raw}
	for rows.Next() {
		if err := rows.Scan(scan...); err != nil {
			return nil, fmt.Errorf("read hosts: %w", err)
		}
		if k, ok := prev.kept[name]; ok && !changed {
			hs.keep(name, k)
			continue
		}
		hs.addAt(hr, name, raw, at)
	}
	return hs, rows.Err()
}

// add adds the host name with its last report raw (JSON), unless the
// report does not decode.
func (hs *hostSet) add(hr *hostReader, name string, raw []byte) {
	hs.addAt(hr, name, raw, time.Time{})
}

// addAt is add of a report its hosts row had at updated_at at (zero:
// not known); the host is kept for the next refresh when at is known and
// nothing of it came from the catalog.
func (hs *hostSet) addAt(hr *hostReader, name string, raw []byte, at time.Time) {
	var r hostReport
	if json.Unmarshal(raw, &r) != nil {
		return
	}
	var guests []guestDriver
	for _, g := range r.GPUs {
		for _, v := range g.Active {
			if id, err := uuid.Parse(v.InstanceUUID); err == nil && v.GuestDriver != "" {
				guests = append(guests, guestDriver{id, hr.str(v.GuestDriver)})
			}
		}
	}
	h, fromCat := hr.hostCat(name, &r)
	k := keptHost{at: at, host: h, guests: guests}
	if hs.kept != nil && !at.IsZero() && !fromCat {
		hs.kept[name] = k
	}
	hs.place(name, k)
}

// keep adds a host prev read, unchanged since.
func (hs *hostSet) keep(name string, k keptHost) {
	hs.kept[name] = k
	hs.place(name, k)
}

func (hs *hostSet) place(name string, k keptHost) {
	for _, g := range k.guests {
		hs.guest[g.instance] = g.driver
	}
	hs.byName[name] = len(hs.hosts)
	hs.hosts = append(hs.hosts, k.host)
}

// Querier is what reads need of a transaction or pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// loadFacts reads the event's instance, its direct-path vGPUs, its host's
// last report and its project's usage (as ur says: readUsage).
func (r *factReader) loadFacts(ctx context.Context, tx pgx.Tx, ev policy.Event, hs *hostSet, ur usageRead) (Facts, *snapshot, error) {
	f := Facts{Now: time.Now(), StaleAge: r.staleAge, Deleting: ev.Kind == NovaKindPrefix+"instance.delete.end"}
	f.Instance.UUID = ev.InstanceUUID
	f.Rebuilt = rebuildKind(ev.Kind)
	st := &snapshot{hosts: hs.hosts, byName: hs.byName}
	if ev.InstanceUUID == "" {
		return f, st, nil
	}
	instance, err := uuid.Parse(ev.InstanceUUID)
	if err != nil {
		return f, st, nil
	}
	var flavor string
	var vgpus int
	var hostNode string
	var lastReport *time.Time
	var declared string
	// A decision's own read (lazy: without the project's lock) reads, in
	// the instance's statement, its vGPUs, its project's usage and the
	// policy's load state of it too (one statement instead of four).
	together := ur.lazy
	var atts []flow.Attachment
	var usageRows, loadState []byte
	var usageProject string
	if together {
		var known bool
		var attsRaw []byte
		err = tx.QueryRow(ctx, `WITH inst AS (SELECT * FROM instances WHERE uuid = $1::uuid),
				proj AS (SELECT coalesce(nullif($2::text, ''), (SELECT project_id FROM inst), '') AS id)
			SELECT coalesce(i.project_id,''), coalesce(i.user_id,''), coalesce(i.host,''), coalesce(i.node,''),
				coalesce(i.vm_state,''), i.deleted_at IS NOT NULL OR coalesce(i.vm_state,'') = 'deleted', coalesce(i.flavor->>'name',''),
				coalesce(i.vgpus, 0), coalesce(h.node,''), h.last_report_at, coalesce(i.guest_driver,''), i.uuid IS NOT NULL,
				`+requests.AttachmentsJSON(`instance_uuid = $1::uuid AND state IN ('pending','attached','releasing')`)+`,
				(SELECT id FROM proj),
				CASE WHEN (SELECT id FROM proj) <> '' THEN (SELECT coalesce(jsonb_agg(jsonb_build_array(u.p, u.n, u.d)), '[]'::jsonb)
					FROM (`+strings.ReplaceAll(projectUsageSQL, "$1", "(SELECT id FROM proj)")+`) u(p, n, d)) END,
				`+policystate.SnapshotJSON("$3::text")+`
			FROM (SELECT 1) one LEFT JOIN inst i ON true LEFT JOIN hosts h ON h.name = i.host`, ev.InstanceUUID, ev.ProjectID, ev.InstanceUUID).
			Scan(&f.Instance.ProjectID, &f.Instance.UserID, &f.Instance.Host, &f.Instance.Node, &f.Instance.VMState,
				&f.Instance.Deleted, &flavor, &vgpus, &hostNode, &lastReport, &declared, &known, &attsRaw, &usageProject, &usageRows, &loadState)
		if err != nil {
			return f, nil, fmt.Errorf("read instance %s: %w", ev.InstanceUUID, err)
		}
		f.Instance.Known = known
		if atts, err = requests.ParseAttachments(attsRaw); err != nil {
			return f, nil, fmt.Errorf("read attachments of %s: %w", ev.InstanceUUID, err)
		}
		if st.loadState, err = policystate.FromJSON(ev.InstanceUUID, loadState); err != nil {
			return f, nil, err
		}
	} else {
		err = tx.QueryRow(ctx, `SELECT coalesce(i.project_id,''), coalesce(i.user_id,''), coalesce(i.host,''), coalesce(i.node,''),
				coalesce(i.vm_state,''), i.deleted_at IS NOT NULL OR coalesce(i.vm_state,'') = 'deleted', coalesce(i.flavor->>'name',''), i.vgpus,
				coalesce(h.node,''), h.last_report_at, coalesce(i.guest_driver,'')
			FROM instances i LEFT JOIN hosts h ON h.name = i.host WHERE i.uuid = $1`, ev.InstanceUUID).
			Scan(&f.Instance.ProjectID, &f.Instance.UserID, &f.Instance.Host, &f.Instance.Node, &f.Instance.VMState,
				&f.Instance.Deleted, &flavor, &vgpus, &hostNode, &lastReport, &declared)
		switch {
		case err == pgx.ErrNoRows:
		case err != nil:
			return f, nil, fmt.Errorf("read instance %s: %w", ev.InstanceUUID, err)
		default:
			f.Instance.Known = true
		}
	}
	f.Instance.FlavorVGPUs = vgpus
	if hostNode != "" {
		f.Instance.Node = hostNode
	}
	if f.Instance.Node == "" {
		f.Instance.Node = f.Instance.Host
	}
	if lastReport != nil {
		f.LastReport = *lastReport
	}
	if !together {
		if atts, err = activeAttachments(ctx, tx, ev.InstanceUUID); err != nil {
			return f, nil, err
		}
	}
	f.Attachments = atts

	// The driver the guest loaded, as its agent saw it, over the one
	// declared in the server's metadata (an event's own field wins over
	// both, in the policy).
	in := policy.Instance{UUID: ev.InstanceUUID, ProjectID: f.Instance.ProjectID, Host: f.Instance.Host, Flavor: flavor, State: f.Instance.VMState,
		GuestDriver: cmp.Or(hs.guest[instance], declared)}
	if f.Instance.Deleted {
		in.State = "deleted"
	}
	// One entry per profile and physical GPU, in the attachments' order.
	type profGPU struct{ profile, gpu string }
	counts := map[profGPU]int{}
	var order []profGPU
	for _, a := range atts {
		if a.State == flow.AttReleasing {
			continue
		}
		k := profGPU{a.Profile, a.PCIAddress}
		if _, ok := counts[k]; !ok {
			order = append(order, k)
		}
		counts[k] += a.Amount
	}
	for _, k := range order {
		in.VGPUs = append(in.VGPUs, policy.VGPU{Profile: k.profile, Count: counts[k], GPU: k.gpu, Path: policy.VGPUPathDirect})
	}
	if vgpus > 0 {
		// The flavor's (Nova's) vGPUs, with the GPU the host's agent reports (package novaresize).
		in.VGPUs = append(in.VGPUs, r.flavorVGPU(ctx, tx, ev.InstanceUUID, f.Instance.Host, vgpus))
	}
	if f.Instance.Known {
		st.inst = in
	}
	project := ev.ProjectID
	if project == "" {
		project = f.Instance.ProjectID
	}
	if project != "" {
		// One decision of a project at a time adds to its usage: the
		// lock ends with this transaction (never held across a Placement
		// or Nova call), after the decision's attachments or Nova resize
		// are written, so the next one counts them. A decision's own
		// round takes it only when it adds (quota.go).
		var u policy.Usage
		if together && usageProject == project {
			// Read with the instance, without the lock (readUsage's lazy read).
			if u, err = r.usageFrom(ctx, tx, project, usageRows); err != nil {
				return f, nil, err
			}
			r.noteUsage(ur, project, u)
		} else if u, err = r.readUsage(ctx, tx, project, ur); err != nil {
			return f, nil, err
		}
		st.usage, st.project = u, project
		if ur.limits {
			if st.limits, err = r.projectLimits(ctx, tx, project, ur.guard); err != nil {
				return f, nil, err
			}
		}
	}
	return f, st, nil
}

func activeAttachments(ctx context.Context, q Querier, instance string) ([]flow.Attachment, error) {
	rows, err := q.Query(ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments
		WHERE instance_uuid = $1 AND state IN ('pending','attached','releasing') ORDER BY created_at, id`, instance)
	if err != nil {
		return nil, fmt.Errorf("read attachments of %s: %w", instance, err)
	}
	out, err := requests.ScanAttachments(rows)
	if err != nil {
		return nil, fmt.Errorf("read attachments of %s: %w", instance, err)
	}
	return out, nil
}

// bridgeVGPUsByProfile are the rows (profile, count, NULL) of project $1's
// vGPUs the bridge knows before Placement does or beside it: direct-path
// vGPUs (pending, attached, or held off a forced-down host), vGPUs of Nova resizes still under way, and
// vGPUs decisions planned and are claiming; the callers add their flavor
// arm after its UNION ALL.
const bridgeVGPUsByProfile = `SELECT coalesce(a.profile,''), sum(a.amount)::int, NULL::jsonb FROM vgpu_attachments a
			JOIN instances i ON i.uuid = a.instance_uuid
			WHERE i.project_id = $1 AND (a.state IN ('pending','attached') OR (a.state = 'held' AND a.provider_uuid IS NOT NULL)) GROUP BY 1
		UNION ALL
		SELECT coalesce(r.profile,''), sum(r.count)::int, NULL FROM nova_resizes r JOIN instances i ON i.uuid = r.instance_uuid
			WHERE i.project_id = $1 AND r.step <> 'done' GROUP BY 1
		UNION ALL
		SELECT c.profile, sum(c.units)::int, NULL FROM planned_claims c JOIN instances i ON i.uuid = c.instance_uuid
			JOIN events e ON e.id = c.event_id AND e.processed_at IS NULL
			WHERE i.project_id = $1 GROUP BY 1
		UNION ALL`

// projectUsageSQL reads the rows (profile, count, flavor's demand) of
// project $1's usage (projectUsage): direct-path vGPUs; vGPUs of Nova
// resizes still under way (they count before Nova's notifications do);
// vGPUs decisions planned and are claiming (requests.PlanClaims); the
// flavors' vGPUs, with their request groups for the framebuffer.
const projectUsageSQL = bridgeVGPUsByProfile + `
		SELECT '', vgpus, coalesce(vgpu_demand, 'null'::jsonb) FROM instances
			WHERE project_id = $1 AND deleted_at IS NULL AND vgpus > 0`

func (r *factReader) projectUsage(ctx context.Context, q Querier, project string) (policy.Usage, error) {
	rows, err := q.Query(ctx, projectUsageSQL, project)
	if err != nil {
		return policy.Usage{}, fmt.Errorf("read usage of project %s: %w", project, err)
	}
	var u policy.Usage
	var prof string
	var n int
	var demand []byte
	_, err = pgx.ForEachRow(rows, []any{&prof, &n, &demand}, func() error {
		r.addUsage(&u, prof, n, demand)
		return nil
	})
	if err != nil {
		return u, fmt.Errorf("read usage of project %s: %w", project, err)
	}
	if err := r.addNovaVFs(ctx, q, project, &u); err != nil {
		return u, err
	}
	return u, nil
}

// usageFrom is projectUsage from its rows read as a JSON array of
// [profile, count, demand] (loadFacts).
func (r *factReader) usageFrom(ctx context.Context, q Querier, project string, raw []byte) (policy.Usage, error) {
	var u policy.Usage
	var rows [][3]json.RawMessage
	if err := json.Unmarshal(raw, &rows); err != nil {
		return u, fmt.Errorf("read usage of project %s: %w", project, err)
	}
	for _, row := range rows {
		var prof string
		var n int
		if err := json.Unmarshal(row[0], &prof); err != nil {
			return u, fmt.Errorf("read usage of project %s: %w", project, err)
		}
		if err := json.Unmarshal(row[1], &n); err != nil {
			return u, fmt.Errorf("read usage of project %s: %w", project, err)
		}
		// A JSON null is both no demand (rows of no flavor) and a
		// flavor's that names none: either counts no framebuffer.
		var demand []byte
		if d := row[2]; len(d) > 0 && string(d) != "null" {
			demand = d
		}
		r.addUsage(&u, prof, n, demand)
	}
	if err := r.addNovaVFs(ctx, q, project, &u); err != nil {
		return u, err
	}
	return u, nil
}

// addUsage adds a row of projectUsageSQL to u.
func (r *factReader) addUsage(u *policy.Usage, prof string, n int, demand []byte) {
	u.VGPUs += n
	switch {
	case demand != nil:
		u.FramebufferMiB += r.flavorFramebufferMiB(demand)
	case prof != "" && r.catalog != nil:
		if cp, ok := r.catalog.ByName(prof); ok {
			u.FramebufferMiB += n * cp.FramebufferMiB
		}
	}
}

// addNovaVFs adds to u the VFs of Nova-owned VF GPUs the project's
// flavors ask for by alias (no statement without [placement]
// nova_vf_aliases).
func (r *factReader) addNovaVFs(ctx context.Context, q Querier, project string, u *policy.Usage) error {
	vfs, err := r.novaVFUsage(ctx, q, project)
	if err != nil {
		return err
	}
	for _, v := range vfs {
		u.VGPUs += v.Amount
		if r.catalog != nil {
			if cp, ok := r.catalog.ByTypeID(v.VGPUType); ok {
				u.FramebufferMiB += v.Amount * cp.FramebufferMiB
			}
		}
	}
	return nil
}

// flavorFramebufferMiB is the framebuffer of a flavor's vGPUs: for each
// request group, its VGPU units times the framebuffer of the profile its
// required CUSTOM_NVIDIA_* trait names. A group without such a trait (any
// type) counts 0: the profile is not known until Nova places it.
func (r *factReader) flavorFramebufferMiB(demand []byte) int {
	var d nova.Demand
	if r.catalog == nil || json.Unmarshal(demand, &d) != nil {
		return 0
	}
	mib := 0
	for _, g := range d.Groups {
		n := g.Resources[nova.ResourceVGPU]
		for _, tr := range g.Required {
			if cp, ok := r.catalog.ByTrait(tr); ok && n > 0 {
				mib += n * cp.FramebufferMiB
				break
			}
		}
	}
	return mib
}

func joinNonEmpty(sep string, parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, sep)
}

// ReportedVGPU is the instance's Nova-owned vGPU as its host's agent last
// reported it (GPU address and profile); reported is false when no agent
// of host ever reported.
func ReportedVGPU(ctx context.Context, q Querier, cat Catalog, instance, host string) (policy.VGPU, bool, error) {
	var v policy.VGPU
	if host == "" {
		return v, false, nil
	}
	var raw []byte
	err := q.QueryRow(ctx, `SELECT report FROM hosts WHERE name = $1 AND report IS NOT NULL`, host).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return v, false, nil
	}
	if err != nil {
		return v, false, fmt.Errorf("read report of %s: %w", host, err)
	}
	var r protocol.Report
	if json.Unmarshal(raw, &r) != nil {
		return v, false, nil
	}
	for _, g := range r.GPUs {
		for _, a := range g.Active {
			if !strings.EqualFold(a.InstanceUUID, instance) {
				continue
			}
			v.GPU = g.PCI
			v.Count++
			for _, t := range g.Types {
				if t.ID == a.TypeID && v.Profile == "" {
					v.Profile = strings.TrimPrefix(t.Name, "GRID ")
				}
			}
			if v.Profile == "" && cat != nil {
				if cp, ok := cat.ByTypeID(a.TypeID); ok {
					v.Profile = cp.Name
				}
			}
		}
	}
	return v, true, nil
}

// flavorVGPU is the policy's view of the vGPUs of an instance's flavor:
// n units on the GPU its host's agent reports, when known (tune intents
// need it). The profile stays empty: the policy's resize rules act on
// direct-path vGPUs only.
func (r *factReader) flavorVGPU(ctx context.Context, q Querier, instance, host string, n int) policy.VGPU {
	v, _, err := ReportedVGPU(ctx, q, r.catalog, instance, host)
	if err != nil {
		r.log.Debug("pipeline: cannot read the host's report", logkey.Host, host, logkey.Err, err)
	}
	return policy.VGPU{Count: n, GPU: v.GPU, Path: policy.VGPUPathNova}
}
