package apiclient

import (
	"encoding/json"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest/ingestwire"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook/webhookwire"
)

// Request states (GET /v1/openapi.json).
const (
	StateAccepted   = "accepted"
	StateDecided    = "decided"
	StateDispatched = "dispatched"
	StateSucceeded  = "succeeded"
	StateFailed     = "failed"
	StateRejected   = "rejected"
)

// FinalState reports whether a request in state s will not change again.
func FinalState(s string) bool {
	return s == StateSucceeded || s == StateFailed || s == StateRejected
}

// Readiness is the answer of /readyz; on 503 Checks holds each failing
// dependency's error.
type Readiness struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
	Raw    json.RawMessage   `json:"-"`
}

// Host is a compute node holding GPUs (GET /v1/hosts, /v1/hosts/{name}).
type Host struct {
	Name     string   `json:"name"`
	Node     string   `json:"node"`
	RootUUID string   `json:"root_provider_uuid"`
	Traits   []string `json:"traits"`
	// GPUCount counts every GPU, the mixed bridge-owned ones
	// (MixedGPUCount) included; Capacity, Used and Free count the vGPUs
	// of the others, Framebuffer sums the mixed ones' MiB (nil without).
	GPUCount      int             `json:"gpu_count"`
	MixedGPUCount int             `json:"mixed_gpu_count,omitempty"`
	Capacity      int             `json:"capacity"`
	Used          int             `json:"used"`
	Free          int             `json:"free"`
	Framebuffer   *GPUFramebuffer `json:"framebuffer,omitempty"`
	// GPUs is filled by GET /v1/hosts/{name} only.
	GPUs []GPU           `json:"gpus,omitempty"`
	Raw  json.RawMessage `json:"-"`
	// Drained by an operator, or Disabled (Nova's compute service): no new placements.
	Drained        bool   `json:"drained"`
	DrainReason    string `json:"drain_reason,omitempty"`
	Disabled       bool   `json:"disabled"`
	DisabledReason string `json:"disabled_reason,omitempty"`
}

// HostReport is the answer of GET /v1/hosts/{name}/report: the host's
// last agent report.
type HostReport struct {
	Name         string          `json:"name"`
	Node         string          `json:"node,omitempty"`
	LastReportAt *time.Time      `json:"last_report_at"`
	Report       protocol.Report `json:"report"`
	Raw          json.RawMessage `json:"-"`
}

// HostList is the answer of GET /v1/hosts.
type HostList struct {
	Hosts []Host          `json:"hosts"`
	Raw   json.RawMessage `json:"-"`
}

// GPU is a physical GPU: one Placement child resource provider.
type GPU struct {
	ProviderUUID  string   `json:"provider_uuid"`
	Name          string   `json:"name"`
	Host          string   `json:"host"`
	Node          string   `json:"node"`
	RootUUID      string   `json:"root_provider_uuid"`
	PCIAddress    string   `json:"pci_address,omitempty"`
	ResourceClass string   `json:"resource_class"`
	Trait         string   `json:"trait,omitempty"`
	Profile       string   `json:"profile,omitempty"`
	Total         int      `json:"total"`
	Reserved      int      `json:"reserved"`
	Capacity      int      `json:"capacity"`
	Used          int      `json:"used"`
	Free          int      `json:"free"`
	Generation    int      `json:"generation"`
	Traits        []string `json:"traits"`
	Drained       bool     `json:"drained"`
	DrainReason   string   `json:"drain_reason,omitempty"`
	Undeclared    bool     `json:"undeclared,omitempty"`
	// Owner is "bridge" (a bridge-owned GPU) or "nova".
	Owner string `json:"owner,omitempty"`
	// Mode is "single" or "mixed" (GPUModeMixed: the amounts above are
	// MiB of CUSTOM_VGPU_BRIDGE_FB_MIB, and Framebuffer, TypesInUse and
	// Health are set).
	Mode        string          `json:"mode,omitempty"`
	Framebuffer *GPUFramebuffer `json:"framebuffer,omitempty"`
	TypesInUse  []GPUTypeInUse  `json:"types_in_use,omitempty"`
	Health      string          `json:"health,omitempty"`
	Problem     string          `json:"problem,omitempty"`
}

// GPUModeMixed is GPU.Mode of a mixed (heterogeneous) bridge-owned GPU.
const GPUModeMixed = "mixed"

// GPUFramebuffer is a mixed GPU's framebuffer in MiB.
type GPUFramebuffer struct {
	TotalMiB int `json:"total_mib"`
	UsedMiB  int `json:"used_mib"`
	FreeMiB  int `json:"free_mib"`
}

// GPUTypeInUse is how many vGPUs of one type a mixed GPU holds.
type GPUTypeInUse struct {
	TypeID         string `json:"type_id"`
	Trait          string `json:"trait"`
	Profile        string `json:"profile,omitempty"`
	FramebufferMiB int    `json:"framebuffer_mib"`
	Count          int    `json:"count"`
}

// GPUList is the answer of GET /v1/gpus.
type GPUList struct {
	GPUs []GPU           `json:"gpus"`
	Raw  json.RawMessage `json:"-"`
}

// GPUFilter narrows GET /v1/gpus; empty fields do not filter.
type GPUFilter struct {
	Host, Trait, Profile string
}

// Instance is a Nova instance as the bridge knows it from notifications.
type Instance struct {
	ingestwire.Instance
	Raw json.RawMessage `json:"-"`
}

// InstanceList is a page of GET /v1/instances.
type InstanceList struct {
	Instances  []Instance      `json:"instances"`
	NextCursor string          `json:"next_cursor,omitempty"`
	Raw        json.RawMessage `json:"-"`
}

// InstanceFilter narrows GET /v1/instances.
type InstanceFilter struct {
	Host, Project string
	// HasVGPU, when not nil, keeps instances with (true) or without vGPU.
	HasVGPU *bool
	// Deleted includes deleted instances.
	Deleted bool
	Limit   int
	Cursor  string
}

// Request is what a source asked for and where it stands.
type Request struct {
	ID           string          `json:"id"`
	Source       string          `json:"source"`
	Kind         string          `json:"kind"`
	InstanceUUID string          `json:"instance_uuid,omitempty"`
	State        string          `json:"state"`
	Phase        string          `json:"phase,omitempty"`
	Reason       string          `json:"reason,omitempty"`
	Code         string          `json:"code,omitempty"`
	Body         json.RawMessage `json:"body,omitempty"`
	CallbackURL  string          `json:"callback_url,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
	UpdatedAt    time.Time       `json:"updated_at"`
	DecidedAt    *time.Time      `json:"decided_at,omitempty"`
	DispatchedAt *time.Time      `json:"dispatched_at,omitempty"`
	FinishedAt   *time.Time      `json:"finished_at,omitempty"`
	Raw          json.RawMessage `json:"-"`
}

// RequestList is the answer of GET /v1/requests.
type RequestList struct {
	Requests []Request       `json:"requests"`
	Raw      json.RawMessage `json:"-"`
}

// RequestFilter narrows GET /v1/requests.
type RequestFilter struct {
	Source, State, InstanceUUID string
	Limit                       int
}

// Event is an inbox record.
type Event = ingestwire.EventRecord

// EventList is a page of GET /v1/events, oldest first.
type EventList struct {
	Events     []Event         `json:"events"`
	NextCursor string          `json:"next_cursor,omitempty"`
	Raw        json.RawMessage `json:"-"`
}

// EventFilter narrows GET /v1/events.
type EventFilter struct {
	Instance string
	// Type matches exactly, or as a prefix when it ends with '*'.
	Type    string
	Since   time.Time
	Payload bool
	Limit   int
	Cursor  string
}

// DeadLetter is a message that could not be accepted.
type DeadLetter = ingestwire.DeadLetter

// DeadLetterList is a page of GET /v1/dead-letters, newest first.
type DeadLetterList struct {
	DeadLetters []DeadLetter    `json:"dead_letters"`
	NextCursor  string          `json:"next_cursor,omitempty"`
	Raw         json.RawMessage `json:"-"`
}

// DeadLetterFilter narrows GET /v1/dead-letters.
type DeadLetterFilter struct {
	Reason, Source string
	Limit          int
	Cursor         string
}

// Allocation is a vGPU allocation held on a GPU provider.
type Allocation struct {
	InstanceUUID  string `json:"instance_uuid"`
	ProviderUUID  string `json:"provider_uuid"`
	ResourceClass string `json:"resource_class"`
	Amount        int    `json:"amount"`
	Host          string `json:"host,omitempty"`
	PCIAddress    string `json:"pci_address,omitempty"`
	Profile       string `json:"profile,omitempty"`
}

// AllocationList is the answer of GET /v1/allocations.
type AllocationList struct {
	Allocations []Allocation    `json:"allocations"`
	Raw         json.RawMessage `json:"-"`
}

// Traits are required and forbidden traits of a dry run.
type Traits struct {
	Required  []string `json:"required,omitempty"`
	Forbidden []string `json:"forbidden,omitempty"`
}

// DryRunRequest is the body of POST /v1/placements/dry-run.
type DryRunRequest struct {
	Profile     string  `json:"profile,omitempty"`
	Traits      *Traits `json:"traits,omitempty"`
	Count       int     `json:"count,omitempty"`
	Host        string  `json:"host,omitempty"`
	Strategy    string  `json:"strategy,omitempty"`
	AllowRetype bool    `json:"allow_retype,omitempty"`
	Limit       int     `json:"limit,omitempty"`
}

// Candidate is one GPU a dry run found, best first.
type Candidate struct {
	Host         string `json:"host"`
	Node         string `json:"node"`
	ProviderUUID string `json:"provider_uuid"`
	PCIAddress   string `json:"pci_address,omitempty"`
	Profile      string `json:"profile,omitempty"`
	Trait        string `json:"trait,omitempty"`
	Amount       int    `json:"amount"`
	FreeAfter    int    `json:"free_after"`
	NeedsRetype  bool   `json:"needs_retype"`
	RetypeFrom   string `json:"retype_from,omitempty"`
	Reason       string `json:"reason"`
	// Mode is GPUModeMixed on a mixed bridge-owned GPU: FramebufferMiB is
	// what the vGPUs take and FreeAfter is MiB of framebuffer.
	Mode           string `json:"mode,omitempty"`
	FramebufferMiB int    `json:"framebuffer_mib,omitempty"`
	// NovaConf and RetypeCommand: for a needs_retype answer on a
	// Nova-owned GPU, its host's nova.conf change and the vgpuctl command.
	NovaConf      *NovaConfChange `json:"nova_conf_change,omitempty"`
	RetypeCommand string          `json:"retype_command,omitempty"`
}

// NovaConfChange is the nova.conf change that re-types Nova-owned GPUs
// of one host (placement/novaconf.Change).
type NovaConfChange struct {
	Host string `json:"host"`
	GPUs []struct {
		PCI          string `json:"pci_address"`
		From         string `json:"from_type,omitempty"`
		To           string `json:"to_type"`
		Provider     string `json:"provider"`
		ProviderUUID string `json:"provider_uuid,omitempty"`
		FromTrait    string `json:"from_trait,omitempty"`
		ToTrait      string `json:"to_trait"`
	} `json:"gpus"`
	EnabledMdevTypes []string `json:"enabled_mdev_types"`
	Text             string   `json:"nova_conf"`
}

// DryRunResponse is the answer of a dry run.
type DryRunResponse struct {
	Candidates []Candidate `json:"candidates"`
	// Rejected are the mixed bridge-owned GPUs offering the type that
	// cannot take the request now, Reason saying why.
	Rejected []Candidate     `json:"rejected,omitempty"`
	Raw      json.RawMessage `json:"-"`
}

// Explanation is the answer of POST /v1/policy/explain. The decision's
// fields are kept as sent in Raw; Text is its rendering for people.
type Explanation struct {
	Event    string          `json:"event"`
	Instance string          `json:"instance_uuid,omitempty"`
	Rejected bool            `json:"rejected"`
	Reason   string          `json:"reason,omitempty"`
	Intents  []Intent        `json:"intents"`
	Text     string          `json:"text"`
	Raw      json.RawMessage `json:"-"`
}

// Intent is one thing a decision wants done.
type Intent struct {
	Kind     string `json:"kind"`
	Rule     string `json:"rule"`
	Instance string `json:"instance_uuid,omitempty"`
	Host     string `json:"host,omitempty"`
	Profile  string `json:"profile,omitempty"`
	Count    int    `json:"count,omitempty"`
	Mode     string `json:"mode,omitempty"`
}

// Skipped is an alert a webhook answer left out, with why.
type Skipped = webhookwire.Skipped

// WebhookAnswer is the 202 answer of POST /v1/webhooks/{source}.
type WebhookAnswer struct {
	RequestID string          `json:"request_id"`
	StatusURL string          `json:"status_url"`
	Skipped   []Skipped       `json:"skipped"`
	Raw       json.RawMessage `json:"-"`
}

// SyncResult is what POST /v1/placements/sync did.
type SyncResult struct {
	Full            bool            `json:"full"`
	Providers       int             `json:"providers"`
	Fetched         int             `json:"fetched"`
	Removed         int             `json:"removed"`
	GPUs            int             `json:"gpus"`
	DurationSeconds float64         `json:"duration_seconds"`
	Raw             json.RawMessage `json:"-"`
}

// RetypeResult answers POST /v1/hosts/{name}/gpus/{pci}/retype: the GPU's
// type now and the step of its re-type (done).
type RetypeResult struct {
	Host   string          `json:"host"`
	PCI    string          `json:"pci"`
	TypeID string          `json:"type_id"`
	Step   string          `json:"step"`
	Raw    json.RawMessage `json:"-"`
}

// PolicyReplayRequest is the body of POST /v1/policy/replay: the window
// and the candidate rules file's text.
type PolicyReplayRequest struct {
	Since     time.Time `json:"since"`
	Until     time.Time `json:"until"`
	Rules     string    `json:"rules"`
	MaxEvents int       `json:"max_events,omitempty"`
}

// PolicyReplaySide is what one policy decided about a replayed event.
type PolicyReplaySide struct {
	Intents    []Intent `json:"intents"`
	Rejected   bool     `json:"rejected,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	RuleErrors []string `json:"rule_errors,omitempty"`
}

// PolicyReplayEvent is one replayed event: the intents of the rules in
// force (Active) and of the candidate, and the intent kinds that differ.
type PolicyReplayEvent struct {
	ID        int64            `json:"id"`
	Kind      string           `json:"kind"`
	Instance  string           `json:"instance_uuid,omitempty"`
	Time      time.Time        `json:"time"`
	Active    PolicyReplaySide `json:"active"`
	Candidate PolicyReplaySide `json:"candidate"`
	Differs   []string         `json:"differs,omitempty"`
	Error     string           `json:"error,omitempty"`
}

// PolicyReplaySummary counts a replay.
type PolicyReplaySummary struct {
	Events    int            `json:"events"`
	Evaluated int            `json:"evaluated"`
	Failed    int            `json:"failed"`
	Differing int            `json:"differing"`
	Differ    map[string]int `json:"differ"`
	Truncated bool           `json:"truncated"`
	MaxEvents int            `json:"max_events"`
}

// PolicyReplay is the answer of POST /v1/policy/replay.
type PolicyReplay struct {
	Events  []PolicyReplayEvent `json:"events"`
	Summary PolicyReplaySummary `json:"summary"`
	// Error says why the replay ended early.
	Error string          `json:"error,omitempty"`
	Raw   json.RawMessage `json:"-"`
}
