package requests

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// A resize through Nova (package novaresize) keeps its state in
// nova_resizes, one row per request; these verbs write it.

// NovaResize is the row of a resize about to be called.
type NovaResize struct {
	Request                uuid.UUID
	Instance               string
	Profile, TypeID, Trait string
	Count                  int
	SourceHost             string
	NovaRequestID          string
	Deadline               time.Duration // from now
	Kind                   string
	Untyped                bool
	// LeaveGPU is, for a move, the GPU (PCI address on SourceHost) the
	// vGPU must leave.
	LeaveGPU string
}

// CreateNovaResize writes r's row at step resize, due now.
func CreateNovaResize(ctx context.Context, q Execer, r NovaResize) error {
	_, err := q.Exec(ctx, `INSERT INTO nova_resizes (request_id, instance_uuid, step, profile, type_id, trait, count, source_host,
			nova_request_id, due_at, deadline_at, kind, untyped, leave_gpu)
		VALUES ($1, $2, 'resize', $3, $4, $5, $6, $7, $8, now(), now() + make_interval(secs => $9), $10, $11, nullif($12, ''))`,
		r.Request, r.Instance, r.Profile, r.TypeID, r.Trait, r.Count, r.SourceHost, r.NovaRequestID, r.Deadline.Seconds(), r.Kind, r.Untyped, r.LeaveGPU)
	return err
}

// ResizeStep moves a resize to Step; the other fields change what they
// name, the zero value leaves a column as it is.
type ResizeStep struct {
	Step     string
	Deadline time.Duration // 0 clears it
	Due      bool          // the next call is due now (else none is)
	// ResetAttempts counts the calls of the new step from zero.
	ResetAttempts bool
	TargetHost    string
	VerifyCommand string
	// Fail is why the request fails once the resize is reverted.
	Fail *ResizeFailure
	// Called records the resize call: the flavors, and no error.
	Called *ResizeCall
}

// ResizeFailure is the code and reason a request fails with.
type ResizeFailure struct {
	Code, Reason string
}

// ResizeCall is what a resize call was made with.
type ResizeCall struct {
	FlavorID, FlavorName, OldFlavor string
}

// SetResizeStep moves the resize of request reqID as s says; a resize
// that reaches done is finished now.
func SetResizeStep(ctx context.Context, q Execer, reqID uuid.UUID, s ResizeStep) error {
	args := []any{reqID, s.Step, s.Deadline.Seconds(), s.Due}
	arg := func(v any) string { // v's placeholder
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	sets := ""
	if c := s.Called; c != nil {
		sets += ", flavor_id = nullif(" + arg(c.FlavorID) + ", ''), flavor_name = " + arg(c.FlavorName) + ", old_flavor = " + arg(c.OldFlavor) + ", last_error = NULL"
	}
	if f := s.Fail; f != nil {
		sets += ", fail_code = " + arg(f.Code) + ", fail_reason = " + arg(f.Reason)
	}
	if s.TargetHost != "" {
		sets += ", target_host = " + arg(s.TargetHost)
	}
	if s.VerifyCommand != "" {
		sets += ", verify_command_id = " + arg(s.VerifyCommand)
	}
	if s.ResetAttempts {
		sets += ", attempts = 0"
	}
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET step = $2, updated_at = now(),
		deadline_at = CASE WHEN $3::float8 > 0 THEN now() + make_interval(secs => $3) ELSE NULL END,
		due_at = CASE WHEN $4 THEN now() ELSE NULL END,
		finished_at = CASE WHEN $2 = 'done' THEN now() ELSE NULL END`+sets+` WHERE request_id = $1`, args...)
	if err != nil {
		return fmt.Errorf("nova resize %s → %s: %w", reqID, s.Step, err)
	}
	return nil
}

// SetResizeTarget records the host Nova resized the instance to.
func SetResizeTarget(ctx context.Context, q Execer, reqID uuid.UUID, host string) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET target_host = $2 WHERE request_id = $1`, reqID, host)
	return err
}

// SetResizeFlavorName records the name of the flavor Nova resized to.
func SetResizeFlavorName(ctx context.Context, q Execer, reqID uuid.UUID, name string) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET flavor_name = $2 WHERE request_id = $1`, reqID, name)
	return err
}

// LeaseResizeCall makes the next call of the resize due after lease (the
// call under way holds it until then), as the attempts-th.
func LeaseResizeCall(ctx context.Context, q Execer, reqID uuid.UUID, lease time.Duration, attempts int) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET due_at = now() + make_interval(secs => $2), attempts = $3, updated_at = now() WHERE request_id = $1`,
		reqID, lease.Seconds(), attempts)
	return err
}

// RetryResizeCall makes the call due again after wait, recording why the
// last one failed.
func RetryResizeCall(ctx context.Context, q Execer, reqID uuid.UUID, wait time.Duration, lastErr string) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET due_at = now() + make_interval(secs => $2), last_error = $3, updated_at = now() WHERE request_id = $1`,
		reqID, wait.Seconds(), lastErr)
	return err
}

// MarkResizeSent records that the resize call is about to be made.
func MarkResizeSent(ctx context.Context, q Execer, reqID uuid.UUID) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET resize_sent_at = now() WHERE request_id = $1`, reqID)
	return err
}

// LeaseResizeLook moves the resize's deadline lease on (the look at the
// server under way holds it until then); a resize still resizing is
// overdue from now on.
func LeaseResizeLook(ctx context.Context, q Execer, reqID uuid.UUID, lease time.Duration) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET deadline_at = now() + make_interval(secs => $2), updated_at = now(),
				overdue_at = CASE WHEN step = 'resizing' THEN coalesce(overdue_at, now()) ELSE overdue_at END
			WHERE request_id = $1`, reqID, lease.Seconds())
	return err
}

// RetryResizeLook looks at the server again after wait, recording why
// the last look failed.
func RetryResizeLook(ctx context.Context, q Execer, reqID uuid.UUID, wait time.Duration, lastErr string) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET deadline_at = now() + make_interval(secs => $2), last_error = $3 WHERE request_id = $1`,
		reqID, wait.Seconds(), lastErr)
	return err
}

// FollowResizeAt looks at the overdue resize's server again after wait.
func FollowResizeAt(ctx context.Context, q Execer, reqID uuid.UUID, wait time.Duration) error {
	_, err := q.Exec(ctx, `UPDATE nova_resizes SET deadline_at = now() + make_interval(secs => $2), updated_at = now() WHERE request_id = $1`,
		reqID, wait.Seconds())
	return err
}
