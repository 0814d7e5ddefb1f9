package nova

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Payload is a typed nova_object payload: *InstanceAction, *InstanceUpdate,
// *Flavor, *ComputeTask, *ServiceStatus, or *Other for objects the bridge
// does not act on.
type Payload interface {
	// ObjectName is the nova_object.name the payload was decoded from.
	ObjectName() string
}

// Instance is the common part of Nova's InstancePayload (1.x), which every
// instance.* notification carries.
type Instance struct {
	UUID             string             `json:"uuid"`
	TenantID         string             `json:"tenant_id"`
	UserID           string             `json:"user_id"`
	Host             *string            `json:"host"`
	Node             *string            `json:"node"`
	DisplayName      string             `json:"display_name"`
	HostName         string             `json:"host_name"`
	AvailabilityZone *string            `json:"availability_zone"`
	State            string             `json:"state"`
	TaskState        *string            `json:"task_state"`
	PowerState       string             `json:"power_state"`
	Flavor           *Flavor            `json:"-"`
	RawFlavor        *Nested[Flavor]    `json:"flavor"`
	Fault            *Exception         `json:"-"`
	RawFault         *Nested[Exception] `json:"fault"`
	ImageUUID        string             `json:"image_uuid"`
	Locked           bool               `json:"locked"`
	CreatedAt        Time               `json:"created_at"`
	LaunchedAt       Time               `json:"launched_at"`
	UpdatedAt        Time               `json:"updated_at"`
	TerminatedAt     Time               `json:"terminated_at"`
	DeletedAt        Time               `json:"deleted_at"`
	RequestID        string             `json:"request_id"`
	InitiatorUser    string             `json:"action_initiator_user"`
	InitiatorProject string             `json:"action_initiator_project"`
	Metadata         map[string]any     `json:"metadata"`
}

// InstanceAction is InstanceActionPayload and its variants
// (InstanceCreatePayload, InstanceActionResizePrepPayload,
// InstanceActionRebuildPayload, InstanceActionVolumePayload, …): the
// instance, the fault of an .error event, and the target flavor of a
// resize_prep.
type InstanceAction struct {
	Name string `json:"-"`
	Instance
	NewFlavor    *Flavor         `json:"-"`
	RawNewFlavor *Nested[Flavor] `json:"new_flavor"`
}

// ObjectName implements Payload.
func (p *InstanceAction) ObjectName() string { return p.Name }

// InstanceUpdate is InstanceUpdatePayload (2.x), sent on instance.update.
type InstanceUpdate struct {
	Instance
	StateUpdate    *StateUpdate         `json:"-"`
	RawStateUpdate *Nested[StateUpdate] `json:"state_update"`
	OldDisplayName *string              `json:"old_display_name"`
	Tags           []string             `json:"tags"`
}

// ObjectName implements Payload.
func (*InstanceUpdate) ObjectName() string { return "InstanceUpdatePayload" }

// StateUpdate is InstanceStateUpdatePayload.
type StateUpdate struct {
	OldState     string  `json:"old_state"`
	State        string  `json:"state"`
	OldTaskState *string `json:"old_task_state"`
	NewTaskState *string `json:"new_task_state"`
}

// Flavor is FlavorPayload, alone (flavor.*) or inside an instance payload.
type Flavor struct {
	FlavorID    string            `json:"flavorid"`
	Name        string            `json:"name"`
	VCPUs       int               `json:"vcpus"`
	MemoryMB    int               `json:"memory_mb"`
	RootGB      int               `json:"root_gb"`
	EphemeralGB int               `json:"ephemeral_gb"`
	Swap        int               `json:"swap"`
	Disabled    bool              `json:"disabled"`
	IsPublic    bool              `json:"is_public"`
	ExtraSpecs  map[string]string `json:"extra_specs"`
	Projects    []string          `json:"projects"`
	Description *string           `json:"description"`
}

// ObjectName implements Payload.
func (*Flavor) ObjectName() string { return "FlavorPayload" }

// Exception is ExceptionPayload: an instance fault or a task's reason.
type Exception struct {
	Exception        string `json:"exception"`
	ExceptionMessage string `json:"exception_message"`
	FunctionName     string `json:"function_name"`
	ModuleName       string `json:"module_name"`
	Traceback        string `json:"traceback,omitempty"`
}

// ComputeTask is ComputeTaskPayload (compute_task.build_instances.error,
// compute_task.migrate_server.error, compute_task.rebuild_server.error).
type ComputeTask struct {
	InstanceUUID   string               `json:"instance_uuid"`
	State          string               `json:"state"`
	Reason         *Exception           `json:"-"`
	RawReason      *Nested[Exception]   `json:"reason"`
	RequestSpec    *RequestSpec         `json:"-"`
	RawRequestSpec *Nested[RequestSpec] `json:"request_spec"`
}

// ObjectName implements Payload.
func (*ComputeTask) ObjectName() string { return "ComputeTaskPayload" }

// RequestSpec is the part of RequestSpecPayload the bridge uses.
type RequestSpec struct {
	InstanceUUID string          `json:"instance_uuid"`
	ProjectID    string          `json:"project_id"`
	UserID       string          `json:"user_id"`
	NumInstances int             `json:"num_instances"`
	Flavor       *Flavor         `json:"-"`
	RawFlavor    *Nested[Flavor] `json:"flavor"`
}

// ServiceStatus is ServiceStatusPayload (service.create/update/delete).
type ServiceStatus struct {
	UUID             string  `json:"uuid"`
	Host             string  `json:"host"`
	Binary           string  `json:"binary"`
	Topic            string  `json:"topic"`
	Disabled         bool    `json:"disabled"`
	DisabledReason   *string `json:"disabled_reason"`
	ForcedDown       bool    `json:"forced_down"`
	Version          int     `json:"version"`
	AvailabilityZone *string `json:"availability_zone"`
	LastSeenUp       Time    `json:"last_seen_up"`
	ReportCount      int     `json:"report_count"`
}

// ObjectName implements Payload.
func (*ServiceStatus) ObjectName() string { return "ServiceStatusPayload" }

// Other is a valid nova_object the bridge does not decode (aggregates,
// keypairs, metrics, …).
type Other struct{ Name string }

// ObjectName implements Payload.
func (p *Other) ObjectName() string { return p.Name }

// knownMajor is the major version of each payload this package decodes.
// Minor versions only add fields, which are tolerated.
var knownMajor = map[string]int{
	"InstanceActionPayload":              1,
	"InstanceActionResizePrepPayload":    1,
	"InstanceActionRebuildPayload":       1,
	"InstanceActionRescuePayload":        1,
	"InstanceActionSnapshotPayload":      1,
	"InstanceActionVolumePayload":        1,
	"InstanceActionVolumeSwapPayload":    1,
	"InstanceActionSharePayload":         1,
	"InstanceActionPayloadShareActive":   1,
	"InstanceActionPayloadShareInactive": 1,
	"InstanceCreatePayload":              1,
	"InstanceExistsPayload":              2,
	"InstancePayload":                    1,
	"InstanceUpdatePayload":              2,
	"FlavorPayload":                      1,
	"ComputeTaskPayload":                 1,
	"ServiceStatusPayload":               1,
	"ExceptionPayload":                   1,
	"RequestSpecPayload":                 1,
	"InstanceStateUpdatePayload":         1,
}

// IsInstanceAction reports whether name is one of the InstanceActionPayload
// family decoded as *InstanceAction.
func IsInstanceAction(name string) bool {
	_, ok := knownMajor[name]
	switch name {
	case "InstanceUpdatePayload", "FlavorPayload", "ComputeTaskPayload", "ServiceStatusPayload",
		"ExceptionPayload", "RequestSpecPayload", "InstanceStateUpdatePayload":
		return false
	}
	return ok
}

// Decode decodes the message's payload into its typed form. An object of an
// unknown major version gives a KindUnknownVersion error together with an
// *Other payload (record it, do not apply it); a field of the wrong type or a
// missing identity (an instance without uuid) is KindSchema.
func (m *Message) Decode() (Payload, error) {
	return DecodeObject(m.Payload)
}

// DecodeObject decodes one nova_object; see (*Message).Decode.
func DecodeObject(o Object) (Payload, error) {
	want, known := knownMajor[o.Name]
	if !known {
		return &Other{Name: o.Name}, nil
	}
	major, _, ok := splitVersion(o.Version)
	if !ok {
		return nil, errorf(KindSchema, "payload.nova_object.version", "want MAJOR.MINOR, got %q", o.Version)
	}
	if major != want {
		return &Other{Name: o.Name}, errorf(KindUnknownVersion, "payload", "%s %s (this bridge knows %d.x)", o.Name, o.Version, want)
	}
	switch {
	case o.Name == "InstanceUpdatePayload":
		p := &InstanceUpdate{}
		if err := decodeData(o.Data, p, "payload"); err != nil {
			return nil, err
		}
		if err := p.Instance.resolve("payload"); err != nil {
			return nil, err
		}
		var err error
		if p.StateUpdate, err = p.RawStateUpdate.get("InstanceStateUpdatePayload", "payload.state_update"); err != nil {
			return nil, err
		}
		return p, nil
	case IsInstanceAction(o.Name):
		p := &InstanceAction{Name: o.Name}
		if err := decodeData(o.Data, p, "payload"); err != nil {
			return nil, err
		}
		if err := p.Instance.resolve("payload"); err != nil {
			return nil, err
		}
		var err error
		if p.NewFlavor, err = p.RawNewFlavor.get("FlavorPayload", "payload.new_flavor"); err != nil {
			return nil, err
		}
		return p, nil
	case o.Name == "FlavorPayload":
		p := &Flavor{}
		if err := decodeData(o.Data, p, "payload"); err != nil {
			return nil, err
		}
		if p.FlavorID == "" {
			return nil, errorf(KindSchema, "payload.flavorid", "missing")
		}
		return p, nil
	case o.Name == "ComputeTaskPayload":
		p := &ComputeTask{}
		if err := decodeData(o.Data, p, "payload"); err != nil {
			return nil, err
		}
		if p.InstanceUUID == "" {
			return nil, errorf(KindSchema, "payload.instance_uuid", "missing")
		}
		if !IsUUID(p.InstanceUUID) {
			return nil, errorf(KindSchema, "payload.instance_uuid", "not a UUID: %.64q", p.InstanceUUID)
		}
		var err error
		if p.Reason, err = p.RawReason.get("ExceptionPayload", "payload.reason"); err != nil {
			return nil, err
		}
		if p.RequestSpec, err = p.RawRequestSpec.get("RequestSpecPayload", "payload.request_spec"); err != nil {
			return nil, err
		}
		if p.RequestSpec != nil {
			if p.RequestSpec.Flavor, err = p.RequestSpec.RawFlavor.get("FlavorPayload", "payload.request_spec.flavor"); err != nil {
				return nil, err
			}
		}
		return p, nil
	case o.Name == "ServiceStatusPayload":
		p := &ServiceStatus{}
		if err := decodeData(o.Data, p, "payload"); err != nil {
			return nil, err
		}
		if p.Host == "" {
			return nil, errorf(KindSchema, "payload.host", "missing")
		}
		return p, nil
	}
	return &Other{Name: o.Name}, nil
}

func (in *Instance) resolve(field string) error {
	if in.UUID == "" {
		return errorf(KindSchema, field+".uuid", "missing")
	}
	if !IsUUID(in.UUID) {
		return errorf(KindSchema, field+".uuid", "not a UUID: %.64q", in.UUID)
	}
	var err error
	if in.Flavor, err = in.RawFlavor.get("FlavorPayload", field+".flavor"); err != nil {
		return err
	}
	in.Fault, err = in.RawFault.get("ExceptionPayload", field+".fault")
	return err
}

func decodeData(data json.RawMessage, v any, field string) error {
	if fastData(data, v) {
		return nil
	}
	if err := unmarshalObject(data, v); err != nil {
		return schemaErr(field, err)
	}
	return nil
}

// Nested is a nova_object inside a payload, decoded in the same pass as
// its parent.
type Nested[T any] struct {
	Name    string `json:"nova_object.name"`
	Version string `json:"nova_object.version"`
	Data    *T     `json:"nova_object.data"`
}

// get checks the nested object's name and major version and returns its
// data; nil for a JSON null.
func (n *Nested[T]) get(name, field string) (*T, error) {
	if n == nil {
		return nil, nil
	}
	if n.Name != name {
		return nil, errorf(KindSchema, field+".nova_object.name", "want %s, got %q", name, n.Name)
	}
	if major, _, ok := splitVersion(n.Version); !ok || major != knownMajor[name] {
		return nil, errorf(KindUnknownVersion, field, "%s %q (this bridge knows %d.x)", name, n.Version, knownMajor[name])
	}
	if n.Data == nil {
		return nil, errorf(KindSchema, field+".nova_object.data", "missing")
	}
	return n.Data, nil
}

func schemaErr(field string, err error) error {
	if te, ok := err.(*json.UnmarshalTypeError); ok {
		f := field
		if te.Field != "" {
			// Drop the Go name of the embedded Instance struct.
			f += "." + strings.TrimPrefix(te.Field, "Instance.")
		}
		return &Error{Kind: KindSchema, Field: f, Msg: fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)}
	}
	return &Error{Kind: KindSchema, Field: field, Err: err}
}

// IsUUID reports whether s is a UUID in its canonical 8-4-4-4-12 hex form
// (upper or lower case), as Nova writes instance UUIDs.
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}
