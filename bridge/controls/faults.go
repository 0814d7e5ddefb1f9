package controls

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// FaultDrainPrefix starts the drain reason of a GPU marked for a fault.
const FaultDrainPrefix = "GPU fault: "

// Fault is a GPU mark made from an agent's report (GPUFaults).
type Fault struct {
	ProviderUUID string
	Host, Node   string
	PCIAddress   string
	Fault        protocol.GPUFault
	// Instances run a vGPU on the GPU, as the report says.
	Instances []string
}

// GPUFaults applies the faults of host's report (node: its Placement
// root provider name) to the gpus rows of that node: a GPU whose agent
// starts reporting a fault (or another one) is drained with the fault as
// its reason and marked (fault_reason), in one audited transaction per
// GPU; a GPU whose agent stops reporting it keeps the mark until an
// operator undrains it (the report change is audited). A fault keeps
// marking nothing while the agent still reports the fault an operator
// undrained over. It returns the GPUs newly marked. GPUs that the
// Placement mirror has not written yet are left for the next report.
func (s *Store) GPUFaults(ctx context.Context, host, node string, gpus []protocol.GPU) ([]Fault, error) {
	reported := map[string]protocol.GPUFault{}
	instances := map[string][]string{}
	var pcis []string
	for _, g := range gpus {
		if g.Fault != nil && g.Fault.Reason != "" {
			reported[g.PCI] = *g.Fault
			pcis = append(pcis, g.PCI)
			for _, v := range g.Active {
				if v.InstanceUUID != "" && !slices.Contains(instances[g.PCI], v.InstanceUUID) {
					instances[g.PCI] = append(instances[g.PCI], v.InstanceUUID)
				}
			}
		}
	}
	if pcis == nil {
		pcis = []string{}
	}
	// The rows to look at: those reported faulted and those that were.
	rows, err := s.pool.Query(ctx, `SELECT provider_uuid::text, pci_address FROM gpus
		WHERE node = $1 AND (pci_address = ANY($2) OR reported_fault IS NOT NULL)`, node, pcis)
	if err != nil {
		return nil, fmt.Errorf("faults of %s: %w", node, err)
	}
	type row struct{ id, pci string }
	todo, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.pci)
	})
	if err != nil {
		return nil, fmt.Errorf("faults of %s: %w", node, err)
	}
	who := Actor{Name: "vgpu-agent/" + host}
	var marked []Fault
	for _, r := range todo {
		f, faulted := reported[r.pci]
		var newly bool
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var was string
			var drained bool
			if err := tx.QueryRow(ctx, `SELECT coalesce(reported_fault,''), drained FROM gpus WHERE provider_uuid = $1 FOR UPDATE`,
				r.id).Scan(&was, &drained); err != nil {
				return err
			}
			if was == f.Reason {
				return nil // nothing new: the mark, or its undrain, holds
			}
			if !faulted {
				if _, err := tx.Exec(ctx, `UPDATE gpus SET reported_fault = NULL WHERE provider_uuid = $1`, r.id); err != nil {
					return err
				}
				return Audit(ctx, tx, Entry{Actor: who, Action: "gpu.fault_report_cleared", ObjectType: "gpu", ObjectID: r.id,
					Detail: map[string]any{"host": host, "node": node, "pci_address": r.pci, "was": was,
						"note": "the agent no longer reports the fault; an operator clears the mark (vgpuctl gpu undrain)"}})
			}
			if _, err := tx.Exec(ctx, `UPDATE gpus SET reported_fault = $2, fault_reason = $2,
					faulted_at = coalesce(CASE WHEN fault_reason IS NOT NULL THEN faulted_at END, now()),
					drained = true, drain_reason = $3, drained_by = $4,
					drained_at = coalesce(CASE WHEN drained THEN drained_at END, now())
				WHERE provider_uuid = $1`, r.id, f.Reason, FaultDrainPrefix+f.Reason, who.Name); err != nil {
				return err
			}
			newly = true
			if err := notify.Queue(ctx, tx, notify.GPUFault, notify.Error, notify.GPUFaultObject(notify.GPUFaultPayload{
				ProviderUUID: r.id, Host: host, Node: node, PCIAddress: r.pci, Source: f.Source, Xid: f.Xid, Reason: f.Reason,
				Trait: nova.GPUFaultTrait, Instances: instances[r.pci]})); err != nil {
				return err
			}
			// The rules hear of it once per instance on the GPU (policy kind bridge.GPU_FAULT).
			var at int64
			if err := tx.QueryRow(ctx, `SELECT extract(epoch FROM faulted_at)::bigint FROM gpus WHERE provider_uuid = $1`, r.id).Scan(&at); err != nil {
				return err
			}
			ev, err := json.Marshal(requests.GPUFaultEvent{ProviderUUID: r.id, Host: host, PCIAddress: r.pci, Source: f.Source, Xid: f.Xid, Reason: f.Reason})
			if err != nil {
				return err
			}
			for _, in := range instances[r.pci] {
				if _, err := uuid.Parse(in); err != nil {
					continue // a domain that is not a Nova instance
				}
				if err := requests.QueueEvent(ctx, tx, requests.Event{Source: "bridge", Type: requests.EventGPUFault, Instance: in, Payload: ev,
					MessageID: fmt.Sprintf("%s:%s:%s:%d", requests.EventGPUFault, r.id, in, at)}); err != nil {
					return err
				}
			}
			return Audit(ctx, tx, Entry{Actor: who, Action: "gpu.fault", ObjectType: "gpu", ObjectID: r.id,
				Detail: map[string]any{"host": host, "node": node, "pci_address": r.pci, "source": f.Source, "xid": f.Xid,
					"reason": f.Reason, "was_drained": drained, "previous_fault": was, "instances": instances[r.pci]}})
		})
		if err != nil {
			return marked, fmt.Errorf("fault of GPU %s on %s: %w", r.pci, node, err)
		}
		if newly {
			s.log.Warn("GPU fault: GPU drained", logkey.Object, r.id, logkey.Host, host, "pci_address", r.pci, logkey.Reason, f.Reason)
			marked = append(marked, Fault{ProviderUUID: r.id, Host: host, Node: node, PCIAddress: r.pci, Fault: f, Instances: instances[r.pci]})
		}
	}
	return marked, nil
}
