package transport

import (
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

func TestBackoff(t *testing.T) {
	minD, maxD := 500*time.Millisecond, 30*time.Second
	for n := 0; n < 20; n++ {
		base := min(minD<<n, maxD)
		if n > 10 {
			base = maxD
		}
		for range 50 {
			d := Backoff(n, minD, maxD)
			if d < base/2 || d > base {
				t.Fatalf("Backoff(%d) = %v, want in [%v, %v]", n, d, base/2, base)
			}
		}
	}
}

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
