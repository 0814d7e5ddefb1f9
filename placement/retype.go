package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// Errors of a re-type of a bridge-owned GPU.
var (
	// ErrHostNotReported: no agent of the host ever reported.
	ErrHostNotReported = errors.New("host has not reported")
	// ErrRetypeNotOwned: the GPU is not in [placement] bridge_owned_gpus.
	ErrRetypeNotOwned = errors.New("GPU is not bridge-owned")
	// ErrRetypeInUse: the GPU holds vGPUs of the bridge (typed VFs or
	// mdevs, or units allocated on its provider).
	ErrRetypeInUse = errors.New("GPU has vGPUs of the bridge")
	// ErrRetypeNotCreatable: the agent's last report does not list the
	// type as creatable on the GPU.
	ErrRetypeNotCreatable = errors.New("type not creatable on the GPU")
	// ErrRetypeBusy: another re-type of the GPU is in progress, or began
	// between this one's read and its record.
	ErrRetypeBusy = errors.New("another re-type of the GPU is in progress")
)

// The steps of a re-type, as the owned_gpu_types table records them.
const (
	RetypeWithdrawing = "withdrawing"
	RetypeTyped       = "typed"
	RetypeDone        = "done"
	// RetypeWithdrawn is no recorded step: the point of a re-type where
	// Placement stopped offering the old type and the step is still
	// withdrawing (Config.RetypeStepHook sees it).
	RetypeWithdrawn = "withdrawn"
)

// retypeRow is one row of owned_gpu_types.
type retypeRow struct {
	host, pci, typeID, from, step string
}

// Retype makes typeID the type a bridge-owned GPU (host, pf) offers,
// in an order that leaves no window where Placement offers a type the
// bridge would not attach there:
//
//  1. the intent is recorded (step withdrawing), then the provider stops
//     offering the old type: its inventory reserved whole, then its trait
//     removed, each under the provider's generation;
//  2. with Placement offering nothing on the GPU, the new type becomes
//     the GPU's type in the bridge's state (step typed);
//  3. the new type's inventory and trait are published (step done).
//
// The re-type itself needs no agent command: on a VF GPU the agent types
// each VF at attach time (attach_vgpu with vendor_vfio and type_id), and
// a free VF has no type; on an mdev GPU it creates each mdev of the type
// at attach time (attach_vgpu with parent_pci and type_id), and an empty
// GPU has no mdev. The GPU must hold no vGPU of the bridge and the
// agent's last report must list typeID as creatable on it. A claim that
// landed on the provider before the withdrawal undoes the re-type (the
// old type is published again) and Retype fails with ErrRetypeInUse.
// A bridge stopped at any step finishes the re-type in PublishOwned.
func (s *Service) Retype(ctx context.Context, host, pf, typeID string) error {
	if s.store == nil {
		return errors.New("re-type: no database")
	}
	pf = strings.ToLower(pf)
	decl, ok := s.ownedDecl(host, pf)
	if !ok {
		return fmt.Errorf("%s/%s: %w ([placement] bridge_owned_gpus)", host, pf, ErrRetypeNotOwned)
	}
	row, found, err := s.retypeRow(ctx, host, pf)
	if err != nil {
		return err
	}
	if decl.Mixed() {
		return fmt.Errorf("%s/%s: %w: %v", host, pf, ErrRetypeNotCreatable, errMixedNotRetyped)
	}
	from := decl.TypeID
	if found {
		if row.step != RetypeDone {
			if row.typeID != typeID {
				return fmt.Errorf("%s/%s: %w: to %s (step %s)", host, pf, ErrRetypeBusy, row.typeID, row.step)
			}
			return s.resumeRetype(ctx, row)
		}
		from = row.typeID
	}
	if from == typeID {
		return nil
	}
	r, err := s.hostReport(ctx, host)
	if err != nil {
		return err
	}
	g, ok := ownedReportGPU(r, pf, from)
	if !ok {
		return fmt.Errorf("%s/%s: %w: the agent's last report has no %s %s", host, pf, ErrRetypeNotCreatable, gpuKind(from), pf)
	}
	if n := bridgeVGPUs(g); n > 0 {
		return fmt.Errorf("%s/%s: %w: %d %s", host, pf, ErrRetypeInUse, n, vgpuNoun(g))
	}
	if !slices.ContainsFunc(g.Types, func(t protocol.VGPUType) bool { return t.ID == typeID && t.AvailableInstances > 0 }) {
		return fmt.Errorf("%s/%s: %w: type %s (the agent reports %s)", host, pf, ErrRetypeNotCreatable, typeID, creatable(g))
	}
	rp, err := s.ownedRP(ctx, r, host, pf)
	if err != nil {
		return err
	}
	if used, err := s.ownedUsed(ctx, rp); err != nil {
		return err
	} else if used > 0 {
		return fmt.Errorf("%s/%s: %w: %d unit(s) allocated on its provider", host, pf, ErrRetypeInUse, used)
	}
	row = retypeRow{host: host, pci: pf, typeID: typeID, from: from, step: RetypeWithdrawing}
	// Recorded only if the GPU's state is still what was read: another
	// re-type (an operator's, another replica's on demand) that began
	// meanwhile is not overwritten.
	tag, err := s.store.Pool().Exec(ctx, `INSERT INTO owned_gpu_types (host, pci, type_id, from_type, step) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (host, pci) DO UPDATE SET type_id = $3, from_type = $4, step = $5, updated_at = now()
		WHERE owned_gpu_types.step = $6 AND owned_gpu_types.type_id = $4`,
		host, pf, typeID, from, RetypeWithdrawing, RetypeDone)
	if err != nil {
		return fmt.Errorf("re-type %s/%s: record: %w", host, pf, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s/%s: %w: it began meanwhile", host, pf, ErrRetypeBusy)
	}
	s.log.Info("placement: bridge-owned GPU re-type", logkey.Host, host, "pci", pf, "from", from, "to", typeID)
	if err := s.retypeStep(RetypeWithdrawing); err != nil {
		return err
	}
	return s.resumeRetype(ctx, row)
}

// resumeRetype runs a re-type from the step its row records.
func (s *Service) resumeRetype(ctx context.Context, row retypeRow) error {
	r, err := s.hostReport(ctx, row.host)
	if err != nil {
		return err
	}
	rp, err := s.ownedRP(ctx, r, row.host, row.pci)
	if err != nil {
		return err
	}
	if row.step == RetypeWithdrawing {
		if err := s.withdrawOwned(ctx, rp); err != nil {
			return fmt.Errorf("re-type %s/%s: withdraw: %w", row.host, row.pci, err)
		}
		s.syncOwned(ctx)
		// A claim made before the withdrawal is still there: the GPU is
		// in use, the re-type is undone.
		if used, err := s.ownedUsed(ctx, rp); err != nil {
			return err
		} else if used > 0 {
			if err := s.undoRetype(ctx, row, r); err != nil {
				return err
			}
			return fmt.Errorf("%s/%s: %w: %d unit(s) allocated on its provider; re-type undone", row.host, row.pci, ErrRetypeInUse, used)
		}
		if err := s.retypeStep(RetypeWithdrawn); err != nil {
			return err
		}
		if _, err := s.store.Pool().Exec(ctx, `UPDATE owned_gpu_types SET step = $3, updated_at = now() WHERE host = $1 AND pci = $2`,
			row.host, row.pci, RetypeTyped); err != nil {
			return fmt.Errorf("re-type %s/%s: record: %w", row.host, row.pci, err)
		}
		row.step = RetypeTyped
		if err := s.retypeStep(RetypeTyped); err != nil {
			return err
		}
	}
	if row.step == RetypeTyped {
		d := OwnedDecl{Host: row.host, PCI: row.pci, TypeID: row.typeID}
		for _, g := range OwnedFromReport([]OwnedDecl{d}, row.host, r) {
			if _, _, err := s.PublishGPU(ctx, g); err != nil {
				return fmt.Errorf("re-type %s/%s: publish %s: %w", row.host, row.pci, row.typeID, err)
			}
		}
		if _, err := s.store.Pool().Exec(ctx, `UPDATE owned_gpu_types SET step = $3, updated_at = now() WHERE host = $1 AND pci = $2`,
			row.host, row.pci, RetypeDone); err != nil {
			return fmt.Errorf("re-type %s/%s: record: %w", row.host, row.pci, err)
		}
		s.log.Info("placement: bridge-owned GPU re-typed", logkey.Host, row.host, "pci", row.pci, "type", row.typeID)
		s.syncOwned(ctx)
		if err := s.retypeStep(RetypeDone); err != nil {
			return err
		}
	}
	return nil
}

// undoRetype publishes the old type again and forgets the re-type.
func (s *Service) undoRetype(ctx context.Context, row retypeRow, r protocol.Report) error {
	d := OwnedDecl{Host: row.host, PCI: row.pci, TypeID: row.from}
	for _, g := range OwnedFromReport([]OwnedDecl{d}, row.host, r) {
		if _, _, err := s.PublishGPU(ctx, g); err != nil {
			return fmt.Errorf("undo re-type %s/%s: publish %s: %w", row.host, row.pci, row.from, err)
		}
	}
	decl, _ := s.ownedDecl(row.host, row.pci)
	var err error
	if row.from == decl.TypeID {
		_, err = s.store.Pool().Exec(ctx, `DELETE FROM owned_gpu_types WHERE host = $1 AND pci = $2`, row.host, row.pci)
	} else {
		_, err = s.store.Pool().Exec(ctx, `UPDATE owned_gpu_types SET type_id = from_type, step = $3, updated_at = now() WHERE host = $1 AND pci = $2`,
			row.host, row.pci, RetypeDone)
	}
	if err != nil {
		return fmt.Errorf("undo re-type %s/%s: %w", row.host, row.pci, err)
	}
	s.log.Warn("placement: bridge-owned GPU re-type undone (in use)", logkey.Host, row.host, "pci", row.pci, "type", row.from)
	s.syncOwned(ctx)
	return nil
}

// withdrawOwned stops rp offering anything: its BridgeClass inventory
// reserved whole, then its traits removed, each under its generation.
func (s *Service) withdrawOwned(ctx context.Context, rp string) error {
	sc := s.client.ServiceClient()
	for attempt := 0; ; attempt++ {
		inv, gen, err := s.client.Inventories(ctx, rp)
		if err != nil {
			return err
		}
		cur, ok := inv[BridgeClass]
		if !ok || cur.Reserved >= cur.Total {
			break
		}
		cur.Reserved = cur.Total
		err = putInventory(ctx, sc, rp, gen, map[string]engine.Inventory{BridgeClass: cur})
		if err == nil {
			break
		}
		if !IsConflict(err) || attempt >= 4 {
			return fmt.Errorf("inventory of %s: %w", rp, err)
		}
	}
	for attempt := 0; ; attempt++ {
		cur, gen, err := s.client.Traits(ctx, rp)
		if err != nil {
			return err
		}
		if len(cur) == 0 {
			return nil
		}
		_, err = resourceproviders.UpdateTraits(ctx, sc, rp, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: gen, Traits: []string{}}).Extract()
		if err == nil {
			return nil
		}
		if !gophercloud.ResponseCodeIs(err, 409) || attempt >= 4 {
			return fmt.Errorf("traits of %s: %w", rp, classify("PUT /resource_providers/{uuid}/traits", err))
		}
	}
}

// resumeRetypes finishes the re-types a stopped bridge left. It returns
// the GPUs whose re-type is still unfinished (not to be published).
func (s *Service) resumeRetypes(ctx context.Context) (map[[2]string]bool, error) {
	rows, err := s.retypeRows(ctx)
	if err != nil {
		return nil, err
	}
	stuck := map[[2]string]bool{}
	var firstErr error
	for _, row := range rows {
		if _, ok := s.ownedDecl(row.host, row.pci); !ok || row.step == RetypeDone {
			continue // done, or the GPU is no longer declared bridge-owned
		}
		if err := s.resumeRetype(ctx, row); err != nil && !errors.Is(err, ErrRetypeInUse) {
			s.log.Warn("placement: bridge-owned GPU re-type not resumed", logkey.Host, row.host, "pci", row.pci, logkey.Err, err)
			stuck[[2]string{row.host, row.pci}] = true
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return stuck, firstErr
}

// ownedDecls are the declared GPUs with the types the bridge re-typed
// them to (owned_gpu_types), without those whose re-type is unfinished.
func (s *Service) ownedDecls(ctx context.Context, stuck map[[2]string]bool) ([]OwnedDecl, error) {
	rows, err := s.retypeRows(ctx)
	if err != nil {
		return nil, err
	}
	var out []OwnedDecl
	for _, d := range s.cfg.OwnedGPUs {
		if stuck[[2]string{d.Host, d.PCI}] {
			continue
		}
		i := slices.IndexFunc(rows, func(r retypeRow) bool { return r.host == d.Host && r.pci == d.PCI })
		if i >= 0 {
			if rows[i].step != RetypeDone {
				continue
			}
			d.TypeID = rows[i].typeID
		}
		out = append(out, d)
	}
	return out, nil
}

// OwnedType is the type the bridge offers on a bridge-owned GPU now, and
// the step of its last re-type ("" when never re-typed).
func (s *Service) OwnedType(ctx context.Context, host, pf string) (typeID, step string, err error) {
	pf = strings.ToLower(pf)
	d, ok := s.ownedDecl(host, pf)
	if !ok {
		return "", "", fmt.Errorf("%s/%s: %w", host, pf, ErrRetypeNotOwned)
	}
	row, found, err := s.retypeRow(ctx, host, pf)
	if err != nil || !found {
		return d.TypeID, "", err
	}
	return row.typeID, row.step, nil
}

func (s *Service) ownedDecl(host, pf string) (OwnedDecl, bool) {
	for _, d := range s.cfg.OwnedGPUs {
		if d.Host == host && strings.EqualFold(d.PCI, pf) {
			return d, true
		}
	}
	return OwnedDecl{}, false
}

func (s *Service) retypeRows(ctx context.Context) ([]retypeRow, error) {
	rows, err := s.store.Pool().Query(ctx, `SELECT host, pci, type_id, from_type, step FROM owned_gpu_types ORDER BY host, pci`)
	if err != nil {
		return nil, fmt.Errorf("bridge-owned GPU types: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (retypeRow, error) {
		var x retypeRow
		err := r.Scan(&x.host, &x.pci, &x.typeID, &x.from, &x.step)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("bridge-owned GPU types: %w", err)
	}
	return out, nil
}

func (s *Service) retypeRow(ctx context.Context, host, pf string) (retypeRow, bool, error) {
	x := retypeRow{host: host, pci: pf}
	err := s.store.Pool().QueryRow(ctx, `SELECT type_id, from_type, step FROM owned_gpu_types WHERE host = $1 AND pci = $2`, host, pf).
		Scan(&x.typeID, &x.from, &x.step)
	if errors.Is(err, pgx.ErrNoRows) {
		return x, false, nil
	}
	if err != nil {
		return x, false, fmt.Errorf("bridge-owned GPU type of %s/%s: %w", host, pf, err)
	}
	return x, true, nil
}

func (s *Service) hostReport(ctx context.Context, host string) (protocol.Report, error) {
	var raw []byte
	var r protocol.Report
	err := s.store.Pool().QueryRow(ctx, `SELECT report FROM hosts WHERE name = $1`, host).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && raw == nil) {
		return r, fmt.Errorf("host %s: %w", host, ErrHostNotReported)
	}
	if err != nil {
		return r, fmt.Errorf("report of %s: %w", host, err)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("report of %s: %w", host, err)
	}
	return r, nil
}

// ownedRP is the uuid of the provider of the bridge-owned GPU pf.
func (s *Service) ownedRP(ctx context.Context, r protocol.Report, host, pf string) (string, error) {
	node := r.Node
	if node == "" {
		node = host
	}
	name := GPUProviderName(node, pf)
	ps, err := s.client.Providers(ctx, ListOpts{Name: name})
	if err != nil {
		return "", err
	}
	if len(ps) != 1 {
		return "", fmt.Errorf("provider %s of bridge-owned GPU %s/%s: %d found (not published yet?)", name, host, pf, len(ps))
	}
	return ps[0].UUID, nil
}

func (s *Service) ownedUsed(ctx context.Context, rp string) (int, error) {
	u, _, err := s.client.Usages(ctx, rp)
	if err != nil {
		return 0, err
	}
	return u[BridgeClass], nil
}

// retypeStep calls Config.RetypeStepHook, if set, once step is reached.
func (s *Service) retypeStep(step string) error {
	if s.cfg.RetypeStepHook == nil {
		return nil
	}
	return s.cfg.RetypeStepHook(step)
}

// gpuKind names the kind of GPU a declaration of typeID is.
func gpuKind(typeID string) string {
	if (OwnedDecl{TypeID: typeID}).Mdev() {
		return "mdev GPU"
	}
	return "vendor-VFIO GPU"
}

// vgpuNoun names the bridge's vGPUs on g: typed VFs or mdevs.
func vgpuNoun(g protocol.GPU) string {
	if g.VendorVFIO {
		return "VF(s) typed by the bridge"
	}
	return "mdev(s) of the bridge"
}

// bridgeVGPUs counts the GPU's VFs the agent typed, or its mdevs the
// agent's journal holds (the bridge's vGPUs).
func bridgeVGPUs(g protocol.GPU) int {
	n := 0
	for _, a := range g.Active {
		if a.Owner == protocol.OwnerAgent {
			n++
		}
	}
	return n
}

func creatable(g protocol.GPU) string {
	var ids []string
	for _, t := range g.Types {
		if t.AvailableInstances > 0 {
			ids = append(ids, t.ID)
		}
	}
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// syncOwned brings the mirror and the index in line with what a re-type
// wrote (the direct path chooses GPUs from them); a sync another replica
// runs meanwhile does the same.
func (s *Service) syncOwned(ctx context.Context) {
	if _, err := s.SyncNow(ctx, false, nil); err != nil && !errors.Is(err, ErrSyncBusy) {
		s.log.Warn("placement: sync after a re-type", logkey.Err, err)
	}
}
