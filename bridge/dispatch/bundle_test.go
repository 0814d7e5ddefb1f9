// SPDX-License-Identifier: Apache-2.0

package dispatch

import (
	"encoding/json"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

func TestHasBundle(t *testing.T) {
	for _, tc := range []struct {
		details string
		want    bool
	}{
		{``, false},
		{`{"diagnostics":{"findings":[]}}`, false},
		{`{"bundle":null}`, false},
		{`{"bundle":""}`, false},
		{`{"bundle":"H4sIAAAA"}`, true},
		{`{"message":"\"bundle\""}`, false},
		{`not json "bundle"`, false},
	} {
		if got := HasBundle(protocol.Result{Details: json.RawMessage(tc.details)}); got != tc.want {
			t.Errorf("HasBundle(%s) = %v, want %v", tc.details, got, tc.want)
		}
	}
}
