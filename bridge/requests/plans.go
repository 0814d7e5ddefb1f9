package requests

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// A decision that needs Placement claims is taken in two transactions
// with the claims between them, none open while Placement is called:
// the first commits the vGPUs it plans to claim (PlanClaims), which count
// in the project's usage from then on; the second records the claims'
// attachments and drops the plan (DropPlanned), so the usage moves from
// one to the other in one commit.

// PlannedClaim is the vGPUs of one profile a decision plans to claim.
type PlannedClaim struct {
	Profile string
	Units   int
}

// PlanClaims records claims the decision of inbox event eventID plans
// for instance and request reqID. What an earlier attempt at the event
// planned is dropped first (DropPlanned).
func PlanClaims(ctx context.Context, tx pgx.Tx, eventID int64, reqID uuid.UUID, instance string, planned []PlannedClaim) error {
	profiles := make([]string, len(planned))
	units := make([]int32, len(planned))
	for i, c := range planned {
		profiles[i], units[i] = c.Profile, int32(max(c.Units, 1))
	}
	_, err := tx.Exec(ctx, `INSERT INTO planned_claims (event_id, request_id, instance_uuid, profile, units)
		SELECT $1, $2, $3::uuid, p, u FROM unnest($4::text[], $5::int[]) AS c(p, u)`,
		eventID, reqID, instance, profiles, units)
	if err != nil {
		return fmt.Errorf("plan the claims of event %d: %w", eventID, err)
	}
	return nil
}

// DropPlanned deletes the planned claims of inbox event eventID: its
// decision recorded them as attachments, or no longer makes them.
func DropPlanned(ctx context.Context, q Execer, eventID int64) error {
	if _, err := q.Exec(ctx, `DELETE FROM planned_claims WHERE event_id = $1`, eventID); err != nil {
		return fmt.Errorf("drop the planned claims of event %d: %w", eventID, err)
	}
	return nil
}

// CloseApplied closes inbox event eventID whose planned claims were
// recorded: the plan goes and the event is processed, in one statement.
func CloseApplied(ctx context.Context, q Execer, eventID int64) error {
	if _, err := q.Exec(ctx, `WITH gone AS (DELETE FROM planned_claims WHERE event_id = $1)
		UPDATE events SET processed_at = now() WHERE id = $1`, eventID); err != nil {
		return fmt.Errorf("close event %d with its claims recorded: %w", eventID, err)
	}
	return nil
}
