// SPDX-License-Identifier: Apache-2.0

package novaharness_test

import (
	"slices"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
)

// TestLiveMigration proves the harness plays the libvirt driver's part
// of a real Nova live migration between two FakeDriver hosts: the domain
// leaves the source and runs on the destination, the allocations follow;
// and that a failure injected in the driver (FailLiveMigration) is rolled
// back by Nova: the server stays ACTIVE on its source with its domain,
// its allocations back on the source.
func TestLiveMigration(t *testing.T) {
	n := novaharness.Start(t, novaharness.Options{Hosts: []string{"lm-a", "lm-b"}})
	a, b := n.Hosts()[0], n.Hosts()[1]
	rootA, rootB := n.ComputeNodeProvider(t, a), n.ComputeNodeProvider(t, b)
	plain := n.CreateFlavor(t, "plain", 1, 512, 1, nil)

	id := n.CreateServer(t, "vm-live", plain, a)
	n.WaitServer(t, id, "ACTIVE")
	n.LiveMigrate(t, id, b)
	s := waitHost(t, n, id, b)
	if s.Status != "ACTIVE" {
		t.Errorf("server %s after the live migration, want ACTIVE", s.Status)
	}
	if _, ok := n.FakeHost(a).Domain(t, id); ok {
		t.Errorf("domain still defined on the source %s", a)
	}
	if d, ok := n.FakeHost(b).Domain(t, id); !ok || d.State != "running" {
		t.Errorf("domain on the destination %s: %+v (found %v), want running", b, d, ok)
	}
	al := n.Allocations(t, id)
	if al[rootB]["VCPU"] != 1 || len(al[rootA]) != 0 {
		t.Errorf("allocations after the live migration %v, want VCPU on %s only", al, rootB)
	}

	// Back to a, failing in the driver: Nova rolls back.
	n.FailLiveMigration(t, id, "injected")
	n.LiveMigrate(t, id, a)
	deadline := time.Now().Add(time.Minute)
	for !slices.Contains(n.FakeHost(b).Events(), "live_migration_failed "+id) {
		if time.Now().After(deadline) {
			t.Fatalf("the injected failure never ran; events on %s: %v", b, n.FakeHost(b).Events())
		}
		time.Sleep(200 * time.Millisecond)
	}
	s = n.WaitServer(t, id, "ACTIVE")
	if s.Host != b {
		t.Errorf("server on %s after the failed live migration, want its source %s", s.Host, b)
	}
	if d, ok := n.FakeHost(b).Domain(t, id); !ok || d.State != "running" {
		t.Errorf("domain on the source after the failed migration: %+v (found %v)", d, ok)
	}
	if _, ok := n.FakeHost(a).Domain(t, id); ok {
		t.Errorf("domain defined on %s after the failed migration", a)
	}
	al = n.Allocations(t, id)
	if al[rootB]["VCPU"] != 1 || len(al[rootA]) != 0 {
		t.Errorf("allocations after the failed live migration %v, want VCPU on %s only", al, rootB)
	}
	n.DeleteServer(t, id)
}

// waitHost waits until the server is on host with no task running.
func waitHost(t *testing.T, n *novaharness.Nova, id, host string) novaharness.Server {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s := n.Server(t, id)
		if s.Host == host && s.TaskState == "" && s.Status != "MIGRATING" {
			return s
		}
		if s.Status == "ERROR" || time.Now().After(deadline) {
			t.Fatalf("server %s on %s (%s, task %q, fault %q), want on %s", id, s.Host, s.Status, s.TaskState, s.Fault, host)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
