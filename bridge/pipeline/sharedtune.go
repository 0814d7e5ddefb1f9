package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// refuseSharedTuning refuses the tune intents an event's sender asked for
// (policy.Intent.Tenant; operator rules' tunes are not touched) when
// another tenant's vGPU shares one of the GPUs: a vGPU scheduler, its
// timeslice and the clocks are per physical GPU, so one tenant may tune
// only a GPU it is alone on. The others on a GPU are what its agent
// reports running there and the bridge's own attachments; a vGPU of an
// instance the bridge does not know counts as another tenant's. Each
// refusal goes to the decision's refused list and to the audit log.
func refuseSharedTuning(ctx context.Context, tx pgx.Tx, d *policy.Decision, actor, reqID string) error {
	if d == nil {
		return nil
	}
	var keep []policy.Intent
	for _, in := range d.Intents {
		if in.Kind != policy.IntentTune || !in.Tenant {
			keep = append(keep, in)
			continue
		}
		why, err := sharedWith(ctx, tx, in)
		if err != nil {
			return err
		}
		if why == "" {
			keep = append(keep, in)
			continue
		}
		reason := why + ": vGPU scheduling and clocks are per physical GPU and shared by its tenants, so only the operator's rules may tune a shared GPU"
		d.Refused = append(d.Refused, policy.Refusal{Intent: in, Reason: reason})
		detail, err := json.Marshal(map[string]any{"rule": in.Rule, "host": in.Host, "gpus": in.GPUs, "scheduler": in.Scheduler,
			"timeslice_us": in.TimesliceUS, "clocks_mhz": in.ClocksMHz, "reason": reason})
		if err != nil {
			return err
		}
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: actor, Action: "tune_refused", ObjectType: "instance",
			ObjectID: orDefault(in.Instance, "-"), RequestID: reqID, Detail: detail}); err != nil {
			return err
		}
	}
	d.Intents = keep
	return nil
}

// sharedWith says which GPU of a tenant's tune intent another tenant's
// vGPU shares, and whose; "" when the instance's project is alone on them.
func sharedWith(ctx context.Context, tx pgx.Tx, in policy.Intent) (string, error) {
	var project string
	if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT project_id FROM instances WHERE uuid::text = $1), '')`, in.Instance).Scan(&project); err != nil {
		return "", fmt.Errorf("tune of %s: read its project: %w", in.Instance, err)
	}
	for _, gpu := range in.GPUs {
		rows, err := tx.Query(ctx, `WITH users AS (
				SELECT a->>'instance_uuid' AS inst FROM hosts h, jsonb_array_elements(coalesce(h.report->'gpus', '[]')) g,
					jsonb_array_elements(coalesce(g->'active', '[]')) a
				WHERE h.name = $1 AND g->>'pci' = $2
				UNION
				SELECT instance_uuid::text FROM vgpu_attachments WHERE host = $1 AND pci_address = $2 AND state NOT IN ('released', 'failed'))
			SELECT coalesce(u.inst, ''), coalesce(i.project_id, '') FROM users u LEFT JOIN instances i ON i.uuid::text = u.inst
			WHERE u.inst IS DISTINCT FROM $3 ORDER BY 1`, in.Host, gpu, in.Instance)
		if err != nil {
			return "", fmt.Errorf("tune of %s: who else is on GPU %s: %w", in.Instance, gpu, err)
		}
		var others []string
		for rows.Next() {
			var inst, proj string
			if err := rows.Scan(&inst, &proj); err != nil {
				rows.Close()
				return "", err
			}
			switch {
			case proj == "":
				others = append(others, "a vGPU of "+orDefault(inst, "a VM")+" that the bridge knows no project of")
			case proj != project || project == "":
				others = append(others, fmt.Sprintf("a vGPU of instance %s of project %s", inst, proj))
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return "", err
		}
		if len(others) > 0 {
			return fmt.Sprintf("GPU %s on %s is shared with another tenant (%s)", gpu, in.Host, strings.Join(others, "; ")), nil
		}
	}
	return "", nil
}
