package transport

import (
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

func TestFingerprintIgnoresVolatile(t *testing.T) {
	u1, u2 := 10.0, 90.0
	a := protocol.Report{Host: "h", Seq: 1, SentAt: time.Now(), GPUs: []protocol.GPU{{PCI: "0000:3b:00.0", UtilPercent: &u1}}}
	b := protocol.Report{Host: "h", Seq: 2, SentAt: time.Now().Add(time.Hour), GPUs: []protocol.GPU{{PCI: "0000:3b:00.0", UtilPercent: &u2}}}
	if fingerprint(a) != fingerprint(b) {
		t.Error("volatile fields change the fingerprint")
	}
	b.GPUs[0].Active = []protocol.VGPU{{MdevUUID: "x"}}
	if fingerprint(a) == fingerprint(b) {
		t.Error("a new vGPU does not change the fingerprint")
	}
	if a.GPUs[0].UtilPercent == nil {
		t.Error("fingerprint modified its argument")
	}
}
