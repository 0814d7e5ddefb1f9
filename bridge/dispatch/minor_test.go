package dispatch

import (
	"encoding/json"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// TestOutgoingMinor: a command goes out at the minor its host reads: the
// bridge's own to an upgraded agent, the one before to an agent not yet
// upgraded or not yet heard from; never outside what either accepts.
func TestOutgoingMinor(t *testing.T) {
	cmd := protocol.Command{V: protocol.Version, Minor: protocol.Minor, ID: "c1", Kind: protocol.VerifyVGPU, Host: "h"}
	body, _ := json.Marshal(cmd)
	minor := func(m int) *int { return &m }
	for _, tt := range []struct {
		name      string
		hostMinor *int
		want      int
		same      bool
	}{
		{"upgraded agent", minor(protocol.Minor), protocol.Minor, true},
		{"agent of the minor before", minor(protocol.Minor - 1), protocol.Minor - 1, false},
		{"agent never heard from", nil, protocol.Minor - 1, false},
		{"newer agent", minor(protocol.Minor + 1), protocol.Minor, true},
		{"much older agent", minor(protocol.Minor - 5), protocol.Minor - 1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, changed, err := outgoing(body, tt.hostMinor, nil)
			if err != nil {
				t.Fatal(err)
			}
			var c protocol.Command
			if err := json.Unmarshal(out, &c); err != nil || c.ID != "c1" {
				t.Fatalf("decode %s: %v", out, err)
			}
			if c.Minor != tt.want || (string(out) == string(body)) != tt.same || changed == tt.same {
				t.Errorf("minor %d (body unchanged %v, changed %v), want %d (unchanged %v)", c.Minor, string(out) == string(body), changed, tt.want, tt.same)
			}
		})
	}
	if _, _, err := outgoing([]byte(`[1]`), minor(1), nil); err == nil {
		t.Error("a body that is no command was rewritten")
	}
}
