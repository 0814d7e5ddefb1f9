// Package driftwire holds the JSON shapes of the drift routes (GET
// /v1/drift, POST /v1/drift/run): the server answers them and vgpuctl's
// client reads them. It imports nothing of the server.
package driftwire

import "time"

// Record is a finding as GET /v1/drift answers it: a difference the
// reconciler found between Placement, the hosts' reports and the bridge's
// records.
type Record struct {
	ID              int64      `json:"id"`
	Kind            string     `json:"kind"`
	Host            *string    `json:"host"`
	ProviderUUID    *string    `json:"provider_uuid"`
	PCIAddress      *string    `json:"pci_address"`
	InstanceUUID    *string    `json:"instance_uuid"`
	MdevUUID        *string    `json:"mdev_uuid"`
	Detail          string     `json:"detail"`
	Repairable      bool       `json:"repairable"`
	Repaired        bool       `json:"repaired"`
	Repair          *string    `json:"repair"`
	RepairRequestID *string    `json:"repair_request_id"`
	RepairedAt      *time.Time `json:"repaired_at"`
	FirstSeen       time.Time  `json:"first_seen"`
	LastSeen        time.Time  `json:"last_seen"`
	Seen            int        `json:"seen"`
	ResolvedAt      *time.Time `json:"resolved_at"`
}

// RunResult sums up one run of the reconciler.
type RunResult struct {
	ID           int64     `json:"id"`
	Replica      string    `json:"replica"`
	StartedAt    time.Time `json:"started_at"`
	FinishedAt   time.Time `json:"finished_at"`
	Findings     int       `json:"findings"`
	New          int       `json:"new_findings"`
	Resolved     int       `json:"resolved"`
	Repairs      int       `json:"repairs"`
	SkippedHosts []string  `json:"skipped_hosts"`
	Error        string    `json:"error,omitempty"`
}
