package pipeline

import (
	"context"
	"encoding/json"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// closeWithout ends a request whose decision does nothing: rejected, or
// failed when the bridge cannot act. A request with several events (an
// Alertmanager group) waits for its last one.
func (d Decisions) closeWithout(ctx context.Context, tx pgx.Tx, row InboxRow, reqID uuid.UUID, state requests.State, plan flow.Plan) error {
	if state != requests.Accepted {
		return nil // a sibling event already decided it
	}
	var others bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM events WHERE request_id = $1 AND id <> $2 AND processed_at IS NULL)`,
		reqID.String(), row.ID).Scan(&others); err != nil {
		return err
	}
	if others {
		return nil
	}
	to := requests.Rejected
	if plan.Outcome == flow.OutcomeFail {
		to = requests.Failed
	}
	_, err := d.requests.Transition(ctx, tx, reqID, to, "", plan.Reason, plan.Code)
	return err
}

func (d Decisions) recordDecision(ctx context.Context, tx pgx.Tx, row InboxRow, reqID *uuid.UUID, dec *policy.Decision, plan flow.Plan) error {
	r, err := d.decisionRecord(row, reqID, dec, plan)
	if err != nil {
		return err
	}
	return requests.RecordDecision(ctx, tx, r)
}

// decisionRecord is the record of decision dec with plan for row
// (recordDecision).
func (d Decisions) decisionRecord(row InboxRow, reqID *uuid.UUID, dec *policy.Decision, plan flow.Plan) (requests.Decision, error) {
	doc, err := json.Marshal(struct {
		*policy.Decision
		Plan struct {
			Outcome flow.Outcome `json:"outcome"`
			Code    string       `json:"code,omitempty"`
			Reason  string       `json:"reason,omitempty"`
			Notes   []string     `json:"notes,omitempty"`
		} `json:"plan"`
		Explanation string `json:"explanation"`
	}{Decision: dec, Plan: struct {
		Outcome flow.Outcome `json:"outcome"`
		Code    string       `json:"code,omitempty"`
		Reason  string       `json:"reason,omitempty"`
		Notes   []string     `json:"notes,omitempty"`
	}{plan.Outcome, plan.Code, plan.Reason, plan.Notes}, Explanation: dec.Explain()})
	if err != nil {
		return requests.Decision{}, err
	}
	var inst *string
	if _, err := uuid.Parse(row.InstanceUUID); err == nil {
		inst = &row.InstanceUUID
	}
	return requests.Decision{EventID: row.ID, RequestID: reqID, InstanceUUID: inst,
		Policy: dec.Policy, Rejected: plan.Outcome == flow.OutcomeReject, Reason: plan.Reason, Doc: doc, Replica: d.replica}, nil
}

func rebuildKind(kind string) bool {
	for _, k := range RebuildEvents {
		if kind == NovaKindPrefix+k {
			return true
		}
	}
	return false
}

// RecordNotify delivers the notify steps among steps, as actor, for
// request reqID about instance: each is audited, queued as the bridge's
// vgpu.policy.notify notification and, when the request has a callback
// URL, as a callback (requests.DeliverPolicyMessage); both leave once tx
// commits.
func RecordNotify(ctx context.Context, tx pgx.Tx, actor string, reqID uuid.UUID, instance string, steps []flow.Step) error {
	for _, s := range steps {
		if s.Kind != flow.StepNotify {
			continue
		}
		if err := requests.DeliverPolicyMessage(ctx, tx, requests.PolicyMessage{Request: reqID, Instance: instance,
			Rule: s.Intent.Rule, Message: s.Intent.Message, Why: s.Intent.Why, Actor: actor}); err != nil {
			return err
		}
	}
	return nil
}

// NextState is to, unless the request is already past it (a sibling event
// of the same request moved it on): then it stays where it is.
func NextState(cur, to requests.State) requests.State {
	if cur == requests.Dispatched && to == requests.Decided {
		return requests.Dispatched
	}
	return to
}

func (d Decisions) actor() string { return "vgpu-bridge/" + d.replica }

// Purposes of commands.
const (
	PurposeAction       = requests.PurposeAction
	PurposeCompensation = requests.PurposeCompensation
)
