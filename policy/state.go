package policy

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
)

// MemState is a State held in memory: for tests, `vgpu-bridge policy
// explain` and the explain API, where the caller supplies the state.
type MemState struct {
	Instances []Instance       `json:"instances,omitempty"`
	HostList  []Host           `json:"hosts,omitempty"`
	Usage     map[string]Usage `json:"usage,omitempty"` // by project id
}

var _ State = (*MemState)(nil)

// Instance implements State.
func (m *MemState) Instance(uuid string) (Instance, bool) {
	for _, in := range m.Instances {
		if in.UUID == uuid {
			return in, true
		}
	}
	return Instance{}, false
}

// Host implements State.
func (m *MemState) Host(name string) (Host, bool) {
	for _, h := range m.HostList {
		if h.Name == name {
			return h, true
		}
	}
	return Host{}, false
}

// Hosts implements State.
func (m *MemState) Hosts() []Host {
	out := append([]Host(nil), m.HostList...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ProjectUsage implements State.
func (m *MemState) ProjectUsage(id string) Usage { return m.Usage[id] }

// ExplainInput is the document `policy explain` and POST /v1/policy/explain
// read: an event, and optionally the state to judge it against.
type ExplainInput struct {
	Event Event     `json:"event"`
	State *MemState `json:"state,omitempty"`
}

// ReadExplainInput decodes an ExplainInput. A document that is a bare
// event (it has "kind" at the top) is accepted too.
func ReadExplainInput(r io.Reader) (ExplainInput, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxFileBytes+1))
	if err != nil {
		return ExplainInput{}, err
	}
	if len(data) > maxFileBytes {
		return ExplainInput{}, fmt.Errorf("explain input larger than %d bytes", maxFileBytes)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(data, &probe); err != nil {
		return ExplainInput{}, fmt.Errorf("explain input: %w", err)
	}
	var in ExplainInput
	if _, bare := probe["kind"]; bare {
		err = json.Unmarshal(data, &in.Event)
	} else {
		err = json.Unmarshal(data, &in)
	}
	if err != nil {
		return ExplainInput{}, fmt.Errorf("explain input: %w", err)
	}
	if in.Event.Kind == "" {
		return ExplainInput{}, fmt.Errorf("explain input: event.kind is required")
	}
	return in, nil
}
