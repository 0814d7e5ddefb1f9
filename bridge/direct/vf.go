package direct

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// errNoFreeVF says the agent's last report lists no VF of the GPU that is
// free and not already taken by a pending or active attachment.
var errNoFreeVF = errors.New("no free VF")

// vfPicker picks the VFs of one act's attachments on bridge-owned VF
// GPUs, in the act's transaction.
type vfPicker struct {
	tx    pgx.Tx
	taken map[string]bool // picked by this act
}

// pick returns a VF of the GPU pf on host that the agent's last report
// lists free (no vGPU type set: a VF Nova typed, or any other owner's, is
// never free) and that no attachment of the bridge holds or is about to
// take (pending, attached or releasing: the report may not show it typed
// yet, or free again already). A transaction-scoped advisory lock per host
// keeps two acts from picking the same VF; it ends with the transaction.
func (v *vfPicker) pick(ctx context.Context, host, pf string) (string, error) {
	if _, err := v.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('vgpu-bridge vf pick ' || $1))`, host); err != nil {
		return "", fmt.Errorf("pick a VF of %s on %s: %w", pf, host, err)
	}
	var raw []byte
	err := v.tx.QueryRow(ctx, `SELECT report FROM hosts WHERE name = $1`, host).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && raw == nil) {
		return "", fmt.Errorf("%w: host %s has not reported", errNoFreeVF, host)
	}
	if err != nil {
		return "", fmt.Errorf("pick a VF of %s on %s: %w", pf, host, err)
	}
	var r protocol.Report
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", fmt.Errorf("pick a VF of %s on %s: report: %w", pf, host, err)
	}
	var free []string
	for _, g := range r.GPUs {
		if g.VendorVFIO && strings.EqualFold(g.PCI, pf) {
			free = append(free, g.FreeVFs...)
		}
	}
	if len(free) == 0 {
		return "", fmt.Errorf("%w: the agent reports none free on GPU %s", errNoFreeVF, pf)
	}
	rows, err := v.tx.Query(ctx, `SELECT pci_address FROM vgpu_attachments
		WHERE host = $1 AND resource_class = ANY($2) AND pci_address = ANY($3) AND state NOT IN ($4, $5)`,
		host, []string{placement.BridgeClass, placement.BridgeFBClass}, free, flow.AttReleased, flow.AttFailed)
	if err != nil {
		return "", fmt.Errorf("pick a VF of %s on %s: %w", pf, host, err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("pick a VF of %s on %s: %w", pf, host, err)
	}
	slices.Sort(free)
	for _, vf := range free {
		if !slices.Contains(held, vf) && !v.taken[vf] {
			if v.taken == nil {
				v.taken = map[string]bool{}
			}
			v.taken[vf] = true
			return vf, nil
		}
	}
	return "", fmt.Errorf("%w: every VF of GPU %s the agent reports free is taken by another vGPU of the bridge", errNoFreeVF, pf)
}
