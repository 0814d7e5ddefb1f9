package novaresize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// resizeRow is one nova_resizes row.
type resizeRow struct {
	RequestID      uuid.UUID
	Instance       string
	Step           string
	Profile        string
	TypeID         string
	Trait          string
	Count          int
	OldFlavor      string
	FlavorID       string
	FlavorName     string
	SourceHost     string
	TargetHost     string
	VerifyCommand  *uuid.UUID
	NovaRequestID  string
	FailCode       string
	FailReason     string
	Attempts       int
	ResizeSent     bool // a resize call may have reached Nova
	RequestState   requests.State
	RequestPhase   string
	DeadlinePassed bool
	Kind           string
	Untyped        bool
	Overdue        bool // the step passed its deadline while Nova worked
	LeaveGPU       string
}

const resizeColumns = `r.request_id, r.instance_uuid::text, r.step, coalesce(r.profile,''), coalesce(r.type_id,''), r.trait, r.count,
	coalesce(r.old_flavor,''), coalesce(r.flavor_id,''), coalesce(r.flavor_name,''), coalesce(r.source_host,''), coalesce(r.target_host,''),
	r.verify_command_id, r.nova_request_id, coalesce(r.fail_code,''), coalesce(r.fail_reason,''), r.attempts, r.resize_sent_at IS NOT NULL, q.state, coalesce(q.phase,''),
	coalesce(r.deadline_at < now(), false), r.kind, r.untyped, r.overdue_at IS NOT NULL, coalesce(r.leave_gpu,'')`

// lockResize reads a nova_resizes row and its request, both locked.
func lockResize(ctx context.Context, tx pgx.Tx, where string, skipLocked bool, args ...any) (resizeRow, bool, error) {
	var r resizeRow
	lock := "FOR UPDATE"
	if skipLocked {
		lock += " SKIP LOCKED"
	}
	var st string
	err := tx.QueryRow(ctx, `SELECT `+resizeColumns+` FROM nova_resizes r JOIN requests q ON q.id = r.request_id WHERE `+where+` LIMIT 1 `+lock, args...).
		Scan(&r.RequestID, &r.Instance, &r.Step, &r.Profile, &r.TypeID, &r.Trait, &r.Count, &r.OldFlavor, &r.FlavorID, &r.FlavorName,
			&r.SourceHost, &r.TargetHost, &r.VerifyCommand, &r.NovaRequestID, &r.FailCode, &r.FailReason, &r.Attempts, &r.ResizeSent, &st, &r.RequestPhase,
			&r.DeadlinePassed, &r.Kind, &r.Untyped, &r.Overdue, &r.LeaveGPU)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("read nova resize: %w", err)
	}
	r.RequestState = requests.State(st)
	return r, true, nil
}

func (r resizeRow) want() computeapi.Want {
	return computeapi.Want{Profile: r.Profile, Trait: r.Trait, Count: r.Count, Untyped: r.Untyped}
}

// onTarget reports whether a server's flavor is the one the resize goes
// to: the chosen flavor once known, else one that carries the wanted vGPU
// (none for a release).
func (r resizeRow) onTarget(f computeapi.Flavor) bool {
	switch {
	case r.FlavorName != "":
		return f.Name == r.FlavorName
	case r.Kind == KindRelease:
		return !computeapi.HasVGPU(f)
	}
	return computeapi.CarriesVGPU(f, r.want())
}

// what says what the resize gives, for reasons: "1 × T4-4Q" or "no vGPU".
func (r resizeRow) what() string {
	switch {
	case r.Kind == KindRelease:
		return "no vGPU"
	case r.Kind == KindMove && r.Profile == "":
		return fmt.Sprintf("%d vGPU(s) of the flavor off GPU %s", r.Count, r.LeaveGPU)
	}
	return fmt.Sprintf("%d × %s", r.Count, r.Profile)
}

func (p *Path) auditNova(ctx context.Context, tx pgx.Tx, r resizeRow, action string, detail map[string]any) error {
	detail["nova_request_id"] = r.NovaRequestID
	d, _ := json.Marshal(detail)
	return requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: action, ObjectType: "instance", ObjectID: r.Instance,
		RequestID: r.RequestID.String(), Detail: d})
}
