// SPDX-License-Identifier: Apache-2.0

package apiclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// FleetUpgradeBody is the body of POST /v1/fleet/upgrades.
type FleetUpgradeBody struct {
	Branch         string   `json:"branch"`
	Version        string   `json:"version,omitempty"`
	Hosts          []string `json:"hosts"`
	MaxUnavailable int      `json:"max_unavailable,omitempty"`
	StopOnFailure  *bool    `json:"stop_on_failure,omitempty"`
	DryRun         bool     `json:"dry_run,omitempty"`
}

// FleetUpgradeHost is one host of a fleet upgrade.
type FleetUpgradeHost struct {
	Host           string `json:"host"`
	State          string `json:"state"`
	FromDriver     string `json:"from_driver,omitempty"`
	ToDriver       string `json:"to_driver,omitempty"`
	MaintenanceID  string `json:"maintenance_id,omitempty"`
	UpgradeCommand string `json:"upgrade_command,omitempty"`
	// Retype is a re-type run's nova.conf change of the host.
	Retype    *NovaConfChange `json:"retype,omitempty"`
	Output    string          `json:"output,omitempty"`
	Error     string          `json:"error,omitempty"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// FleetUpgrade is a fleet upgrade with each host's step.
type FleetUpgrade struct {
	ID             string             `json:"id"`
	Kind           string             `json:"kind"` // upgrade, retype
	Branch         string             `json:"branch"`
	Version        string             `json:"version,omitempty"`
	MaxUnavailable int                `json:"max_unavailable"`
	StopOnFailure  bool               `json:"stop_on_failure"`
	State          string             `json:"state"` // running, done, failed
	Error          string             `json:"error,omitempty"`
	CreatedBy      string             `json:"created_by"`
	CreatedAt      time.Time          `json:"created_at"`
	FinishedAt     *time.Time         `json:"finished_at,omitempty"`
	Hosts          []FleetUpgradeHost `json:"hosts"`
	Raw            json.RawMessage    `json:"-"`
}

// FleetUpgradePlan is a dry run's answer.
type FleetUpgradePlan struct {
	Hosts []struct {
		Host    string `json:"host"`
		Driver  string `json:"driver"`
		Drained bool   `json:"drained"`
		VGPUs   int    `json:"vgpus"`
	} `json:"hosts"`
	Refusals []struct {
		Host     string `json:"host"`
		Instance string `json:"instance"`
		Guest    string `json:"guest_driver"`
		Reason   string `json:"reason"`
	} `json:"refusals"`
	Steps []string        `json:"steps"`
	Raw   json.RawMessage `json:"-"`
}

// StartFleetUpgrade starts a fleet upgrade (admin). A dry run answers the
// plan (plan set, op nil); else the started run.
func (c *Client) StartFleetUpgrade(ctx context.Context, b FleetUpgradeBody) (*FleetUpgradePlan, *FleetUpgrade, error) {
	if b.DryRun {
		var p FleetUpgradePlan
		var err error
		p.Raw, err = c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/fleet/upgrades", Body: b}, &p)
		return &p, nil, err
	}
	op, err := c.startFleetRun(ctx, "/v1/fleet/upgrades", b)
	return nil, op, err
}

// startFleetRun posts a run's body (not a dry run) to path and answers the
// started run.
func (c *Client) startFleetRun(ctx context.Context, path string, body any) (*FleetUpgrade, error) {
	var op FleetUpgrade
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: path, Body: body}, &op)
	op.Raw = raw
	return &op, err
}

// FleetUpgrade returns a fleet upgrade.
func (c *Client) FleetUpgrade(ctx context.Context, id string) (FleetUpgrade, error) {
	var op FleetUpgrade
	raw, err := c.getInto(ctx, "/v1/fleet/upgrades/"+url.PathEscape(id), nil, &op)
	op.Raw = raw
	return op, err
}

// FleetRetypeBody is the body of POST /v1/fleet/retypes.
type FleetRetypeBody struct {
	GPUs          []string `json:"gpus"` // HOST/PCI=TYPE
	StopOnFailure *bool    `json:"stop_on_failure,omitempty"`
	DryRun        bool     `json:"dry_run,omitempty"`
}

// FleetRetypePlan is a re-type dry run's answer.
type FleetRetypePlan struct {
	Hosts []struct {
		Host    string         `json:"host"`
		Drained bool           `json:"drained"`
		Change  NovaConfChange `json:"nova_conf_change"`
	} `json:"hosts"`
	Steps []string        `json:"steps"`
	Raw   json.RawMessage `json:"-"`
}

// StartFleetRetype starts a re-type of Nova-owned GPUs (admin). A dry run
// answers the plan (plan set, op nil); else the started run.
func (c *Client) StartFleetRetype(ctx context.Context, b FleetRetypeBody) (*FleetRetypePlan, *FleetUpgrade, error) {
	if b.DryRun {
		var p FleetRetypePlan
		var err error
		p.Raw, err = c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/fleet/retypes", Body: b}, &p)
		return &p, nil, err
	}
	op, err := c.startFleetRun(ctx, "/v1/fleet/retypes", b)
	return nil, op, err
}
