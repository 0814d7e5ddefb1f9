package bridge

import (
	"bytes"
	"os"
	"testing"
)

// The sample in etc/ is generated; `make genconfig` refreshes it.
func TestSampleConfigIsCurrent(t *testing.T) {
	var b bytes.Buffer
	if err := Options().WriteSample(&b, SampleTitle); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../etc/vgpu-bridge/bridge.conf.sample")
	if err != nil {
		t.Fatalf("%v; run `make genconfig`", err)
	}
	if !bytes.Equal(got, b.Bytes()) {
		t.Fatal("etc/vgpu-bridge/bridge.conf.sample is stale; run `make genconfig` and commit it")
	}
}

// The documentation's configuration reference is generated too.
func TestReferenceIsCurrent(t *testing.T) {
	var b bytes.Buffer
	if err := Options().WriteReference(&b, ReferenceTitle); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../doc/source/reference/bridge-config.rst")
	if err != nil {
		t.Fatalf("%v; run `make genconfig`", err)
	}
	if !bytes.Equal(got, b.Bytes()) {
		t.Fatal("doc/source/reference/bridge-config.rst is stale; run `make genconfig` and commit it")
	}
}
