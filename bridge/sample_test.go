package bridge

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
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

// The sample access policy and the rules' reference are generated from
// the rules' definitions (`make genconfig` runs `vgpu-bridge genpolicy`).
func TestAccessPolicySamplesAreCurrent(t *testing.T) {
	for file, write := range map[string]func(io.Writer, api.RoleNames) error{
		"../etc/vgpu-bridge/policy.yaml.sample": api.WriteSample,
		"../doc/source/reference/policy.rst":    api.WriteReference,
	} {
		var b bytes.Buffer
		if err := write(&b, AccessRoleNames()); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("%v; run `make genconfig`", err)
		}
		if !bytes.Equal(got, b.Bytes()) {
			t.Errorf("%s is stale; run `make genconfig` and commit it", file)
		}
	}
}
