package libvirt

import (
	"context"
	"testing"
)

// TestDefineAndStartThenUndefine: a domain defined from its XML runs with
// its mdev hostdev live; DestroyAndUndefine removes it, and a second call
// (or one for an unknown domain) is not an error.
func TestDefineAndStartThenUndefine(t *testing.T) {
	ctx := context.Background()
	c := openTest(t)
	const id = "5a0c8e9e-1111-4c4e-9a39-3f8f1a2b3c09"
	const mdev = "5a0c8e9e-2222-4c4e-9a39-3f8f1a2b3c09"
	xml := "<domain type='test'><name>instance-00000009</name><uuid>" + id + "</uuid>" +
		"<memory unit='KiB'>1048576</memory><vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os>" +
		"<devices>" + MdevHostdevXML(mdev) + "</devices></domain>"
	if err := c.DefineAndStart(ctx, xml); err != nil {
		t.Fatalf("DefineAndStart: %v", err)
	}
	d, err := c.Domain(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Running() || len(d.Hostdevs) != 1 || d.Hostdevs[0].MdevUUID != mdev || !d.Hostdevs[0].Live {
		t.Errorf("domain %+v, want running with mdev %s live", d, mdev)
	}
	for i := range 2 {
		if err := c.DestroyAndUndefine(ctx, id); err != nil {
			t.Fatalf("DestroyAndUndefine #%d: %v", i+1, err)
		}
	}
	if _, err := c.Domain(ctx, id); err == nil {
		t.Error("the domain is still defined")
	}
	if err := c.DefineAndStart(ctx, "<domain"); err == nil {
		t.Error("DefineAndStart took bad XML")
	}
}
