package flow

// Request codes of the pipeline (requests.code).
const (
	CodePolicyRejected = "policy_rejected"
	CodeRefused        = "refused"
	CodeQuota          = "quota" // the project's quota refused it
	CodeNoAction       = "no_action"
	CodeNovaPath       = "nova_path_unavailable"
	CodeUnsupported    = "unsupported_intent"
	CodeNoInstance     = "unknown_instance"
	CodeNoHost         = "no_host"
	CodeHostStale      = "host_stale"
	CodeNoCapacity     = "no_capacity"
	CodePlacement      = "placement_error"
	CodeBusy           = "change_in_progress"
	CodeAgentTimeout   = "agent_timeout"
	CodeAgentFailed    = "agent_failed"
	CodeAgentRefused   = "agent_refused"
	CodeEventFailed    = "event_failed"
	CodeNotPublished   = "not_published"
	// CodeObserveOnly closes a request decided while observe-only mode is
	// on: its reason says what would have been done.
	CodeObserveOnly = "observe_only"
	// CodeSuperseded ends a deferred request that a newer event of the
	// same kind about the same instance superseded.
	CodeSuperseded = "superseded"
	// CodeCancelled is the code of a request an operator cancelled.
	CodeCancelled = "cancelled"
)

// Request codes of the Nova-native path.
const (
	CodeNoFlavor     = "no_flavor"     // no flavor carries the vGPU; the reason names the one to create
	CodeNovaFailed   = "nova_failed"   // Nova could not resize (NoValidHost, a compute error)
	CodeNovaError    = "nova_error"    // Nova's API refused a call
	CodeNovaTimeout  = "nova_timeout"  // a step did not end by its deadline
	CodeVerifyFailed = "verify_failed" // the agent did not find the vGPU; the resize was reverted
)
