// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// roomChooser gives each host's free units in turn, counting its own
// choices, as a Chooser over the placement index would.
type roomChooser struct {
	hosts []string
	free  map[string]int
	asked [][]string
}

func (c *roomChooser) ChooseHost(need []DirectVGPU, exclude []string) (string, error) {
	c.asked = append(c.asked, exclude)
	n := 0
	for _, d := range need {
		n += max(d.Amount, 1)
	}
	for _, h := range c.hosts {
		if !slices.Contains(exclude, h) && c.free[h] >= n {
			c.free[h] -= n
			return h, nil
		}
	}
	return "", errors.New("no host has room")
}

const (
	i1 = "11111111-0000-0000-0000-000000000001"
	i2 = "11111111-0000-0000-0000-000000000002"
	i3 = "11111111-0000-0000-0000-000000000003"
	m1 = "aaaaaaaa-0000-0000-0000-000000000001"
)

var t4 = DirectVGPU{Mdev: m1, Profile: "T4-4Q", TypeID: "nvidia-232", Trait: "CUSTOM_NVIDIA_232", Provider: "p-a"}

func TestBuild(t *testing.T) {
	type vmWant struct {
		action Action
		path   Path
		target string
		states []State
	}
	nova := VM{Instance: i1, Name: "a-nova", Status: "ACTIVE", FlavorVGPUs: 1}
	direct := VM{Instance: i2, Name: "b-direct", Status: "ACTIVE", Direct: []DirectVGPU{t4}}
	tests := []struct {
		name    string
		vms     []VM
		o       Options
		free    map[string]int
		want    []vmWant
		wantErr bool
	}{
		{"nova path: cold migrate and confirm by default", []VM{nova}, DefaultOptions(), nil,
			[]vmWant{{ColdMigrate, PathNova, "", []State{Migrating, Confirming}}}, false},
		{"nova path: live with live_migrate_vgpu", []VM{nova}, Options{LiveMigrateVGPU: true}, nil,
			[]vmWant{{LiveMigrate, PathNova, "", []State{Migrating}}}, false},
		{"nova path shut off: cold even with live_migrate_vgpu", []VM{{Instance: i1, Status: "SHUTOFF", FlavorVGPUs: 1}}, Options{LiveMigrateVGPU: true}, nil,
			[]vmWant{{ColdMigrate, PathNova, "", []State{Migrating, Confirming}}}, false},
		{"nova path to a given target", []VM{nova}, Options{Target: "hb"}, nil,
			[]vmWant{{ColdMigrate, PathNova, "hb", []State{Migrating, Confirming}}}, false},
		{"direct path: reserve, detach, live-migrate, attach on the chosen host", []VM{direct}, DefaultOptions(), map[string]int{"hb": 1},
			[]vmWant{{MoveDirect, PathDirect, "hb", []State{Detaching, Migrating, Attaching}}}, false},
		{"direct path shut off: cold-migrate and confirm", []VM{{Instance: i2, Status: "SHUTOFF", Direct: []DirectVGPU{t4}}}, DefaultOptions(), map[string]int{"hb": 1},
			[]vmWant{{MoveDirect, PathDirect, "hb", []State{Detaching, Migrating, Confirming, Attaching}}}, false},
		{"direct path: the chooser's room runs out for the second", []VM{direct, {Instance: i3, Name: "c-direct", Status: "ACTIVE", Direct: []DirectVGPU{t4}}},
			DefaultOptions(), map[string]int{"hb": 1},
			[]vmWant{{MoveDirect, PathDirect, "hb", []State{Detaching, Migrating, Attaching}}, {Skip, PathDirect, "", nil}}, false},
		{"direct path with a target is not chosen", []VM{direct}, Options{Target: "hc"}, nil,
			[]vmWant{{MoveDirect, PathDirect, "hc", []State{Detaching, Migrating, Attaching}}}, false},
		{"both paths: skipped", []VM{{Instance: i1, Status: "ACTIVE", FlavorVGPUs: 1, Direct: []DirectVGPU{t4}}}, DefaultOptions(), nil,
			[]vmWant{{Skip, PathNova, "", nil}}, false},
		{"busy in Nova: skipped", []VM{{Instance: i1, Status: "ACTIVE", TaskState: "resize_prep", FlavorVGPUs: 1}}, DefaultOptions(), nil,
			[]vmWant{{Skip, PathNova, "", nil}}, false},
		{"paused: skipped", []VM{{Instance: i1, Status: "PAUSED", FlavorVGPUs: 1}}, DefaultOptions(), nil,
			[]vmWant{{Skip, PathNova, "", nil}}, false},
		{"no vGPU: skipped", []VM{{Instance: i1, Status: "ACTIVE"}}, DefaultOptions(), nil,
			[]vmWant{{Skip, "", "", nil}}, false},
		{"name order", []VM{direct, nova}, Options{Target: "hb"}, nil,
			[]vmWant{{ColdMigrate, PathNova, "hb", []State{Migrating, Confirming}}, {MoveDirect, PathDirect, "hb", []State{Detaching, Migrating, Attaching}}}, false},
		{"target is the host", []VM{nova}, Options{Target: "ha"}, nil, nil, true},
		{"concurrency out of range", []VM{nova}, Options{Concurrency: MaxConcurrency + 1}, nil, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ch := &roomChooser{hosts: []string{"ha", "hb"}, free: map[string]int{"ha": 8}}
			for h, n := range tc.free {
				ch.free[h] = n
			}
			p, err := Build("ha", false, tc.vms, tc.o, ch)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Build: %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var got []vmWant
			for _, v := range p.VMs {
				var states []State
				for _, s := range v.Steps {
					states = append(states, s.State)
				}
				got = append(got, vmWant{v.Action, v.Path, v.Target, states})
				if v.Action == Skip && v.Reason == "" {
					t.Errorf("%s skipped without a reason", v.Instance)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
			for _, ex := range ch.asked {
				if !slices.Contains(ex, "ha") {
					t.Errorf("chooser asked without excluding the source: %v", ex)
				}
			}
			if p.Options.Concurrency < 1 || !p.Drain || !p.Undrain {
				t.Errorf("plan options %+v drain %v undrain %v", p.Options, p.Drain, p.Undrain)
			}
		})
	}
}

func TestAllowed(t *testing.T) {
	tests := []struct {
		from, to State
		want     bool
	}{
		{Pending, Detaching, true},
		{Pending, Migrating, true}, // a Nova-path VM never detaches
		{Detaching, Migrating, true},
		{Migrating, Attaching, true}, // live: no confirm
		{Confirming, Done, true},
		{Attaching, Failed, true},
		{Migrating, Detaching, false},
		{Done, Failed, false},
		{Failed, Pending, false},
		{Pending, Pending, false},
	}
	for _, tc := range tests {
		if got := Allowed(tc.from, tc.to); got != tc.want {
			t.Errorf("Allowed(%s, %s) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestDryRunGolden: the dry run of a host with a Nova-path VM, two
// direct-path VMs (one shut off) and one busy VM.
func TestDryRunGolden(t *testing.T) {
	vms := []VM{
		{Instance: i1, Name: "vm-nova", Status: "ACTIVE", FlavorVGPUs: 1},
		{Instance: i2, Name: "vm-direct-1", Status: "ACTIVE", Direct: []DirectVGPU{t4}},
		{Instance: i3, Name: "vm-direct-2", Status: "SHUTOFF", Direct: []DirectVGPU{{Mdev: "aaaaaaaa-0000-0000-0000-000000000002", Profile: "T4-2Q", Amount: 1}}},
		{Instance: "11111111-0000-0000-0000-000000000004", Name: "vm-busy", Status: "ACTIVE", TaskState: "migrating", FlavorVGPUs: 1},
	}
	o := DefaultOptions()
	o.DryRun = true
	p, err := Build("compute-a", false, vms, o, &roomChooser{hosts: []string{"compute-a", "compute-b"}, free: map[string]int{"compute-b": 4}})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := p.Render(&b); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "dryrun.golden")
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("dry run differs from %s (-update rewrites it):\n%s", golden, b.String())
	}
}
