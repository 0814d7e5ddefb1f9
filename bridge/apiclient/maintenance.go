// SPDX-License-Identifier: Apache-2.0

package apiclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// MigrateAll is the body of POST /v1/hosts/{name}/migrate-all.
type MigrateAll struct {
	Concurrency   int    `json:"concurrency,omitempty"`
	StopOnFailure *bool  `json:"stop_on_failure,omitempty"`
	DryRun        bool   `json:"dry_run,omitempty"`
	Target        string `json:"target,omitempty"`
}

// MaintenanceStep is one step of a VM's plan.
type MaintenanceStep struct {
	State string `json:"state"`
	What  string `json:"what"`
}

// MaintenanceVM is one VM of a maintenance operation (or of its plan:
// no state then).
type MaintenanceVM struct {
	Instance    string            `json:"instance_uuid"`
	Name        string            `json:"name,omitempty"`
	Path        string            `json:"path,omitempty"`
	Action      string            `json:"action"`
	Target      string            `json:"target,omitempty"`
	Reason      string            `json:"reason,omitempty"`
	Steps       []MaintenanceStep `json:"steps,omitempty"`
	State       string            `json:"state,omitempty"`
	Reservation string            `json:"reservation_consumer,omitempty"`
	Migration   string            `json:"migration_uuid,omitempty"`
	UpdatedAt   *time.Time        `json:"updated_at,omitempty"`
}

// MaintenanceOperation is a host maintenance operation.
type MaintenanceOperation struct {
	ID          string          `json:"id"`
	Host        string          `json:"host"`
	State       string          `json:"state"` // running, succeeded, failed
	Options     json.RawMessage `json:"options"`
	DrainedByOp bool            `json:"drained_by_operation"`
	CreatedBy   string          `json:"created_by"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	FinishedAt  *time.Time      `json:"finished_at,omitempty"`
	VMs         []MaintenanceVM `json:"vms"`
	Raw         json.RawMessage `json:"-"`
}

// MaintenancePlan is a dry run's answer.
type MaintenancePlan struct {
	Plan struct {
		Host    string          `json:"host"`
		Drain   bool            `json:"drain"`
		Undrain bool            `json:"undrain"`
		Options json.RawMessage `json:"options"`
		VMs     []MaintenanceVM `json:"vms"`
	} `json:"plan"`
	Text string          `json:"text"`
	Raw  json.RawMessage `json:"-"`
}

// MigrateAllHost starts moving every vGPU VM off host (admin). A dry run
// answers the plan (plan set, op nil); else the started operation.
func (c *Client) MigrateAllHost(ctx context.Context, host string, b MigrateAll) (*MaintenancePlan, *MaintenanceOperation, error) {
	call := Call{Method: http.MethodPost, Path: "/v1/hosts/" + url.PathEscape(host) + "/migrate-all", Body: b}
	if b.DryRun {
		var p MaintenancePlan
		raw, err := c.callInto(ctx, call, &p)
		p.Raw = raw
		return &p, nil, err
	}
	var op MaintenanceOperation
	raw, err := c.callInto(ctx, call, &op)
	op.Raw = raw
	return nil, &op, err
}

// Maintenance returns a maintenance operation with each VM's progress.
func (c *Client) Maintenance(ctx context.Context, id string) (MaintenanceOperation, error) {
	var op MaintenanceOperation
	raw, err := c.getInto(ctx, "/v1/maintenance/"+url.PathEscape(id), nil, &op)
	op.Raw = raw
	return op, err
}

// HostMaintenance returns the host's latest maintenance operation.
func (c *Client) HostMaintenance(ctx context.Context, host string) (MaintenanceOperation, error) {
	var op MaintenanceOperation
	raw, err := c.getInto(ctx, "/v1/hosts/"+url.PathEscape(host)+"/migrate-all", nil, &op)
	op.Raw = raw
	return op, err
}
