package nova_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
)

// dataBase is an instance payload's data with every kind of field the
// fast path reads.
const dataBase = `{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c","tenant_id":"p1","user_id":"u1","host":"h1","node":null,
 "display_name":"vm","host_name":"vm","availability_zone":"nova","state":"active","task_state":null,"power_state":"running",
 "image_uuid":"i1","locked":false,"created_at":"2012-10-29T13:42:11Z","launched_at":"2012-10-29 13:42:11.5","updated_at":null,
 "terminated_at":null,"deleted_at":"","request_id":"req-1","action_initiator_user":"admin","action_initiator_project":"p1",
 "metadata":{"k":"v","b":true,"n":null},
 "flavor":{"nova_object.name":"FlavorPayload","nova_object.namespace":"nova","nova_object.version":"1.4","nova_object.data":
  {"flavorid":"f1","name":"m1","vcpus":2,"memory_mb":-0,"root_gb":1,"ephemeral_gb":0,"swap":0,"disabled":false,"is_public":true,
   "extra_specs":{"resources:VGPU":"1"},"projects":null,"description":"d\u00e9"}},
 "fault":{"nova_object.name":"ExceptionPayload","nova_object.version":"1.1","nova_object.data":{"exception":"E","exception_message":"m","function_name":"f","module_name":"mod","traceback":"t"}},
 "ip_addresses":[{"nova_object.name":"IpPayload","nova_object.data":{"address":"10.0.0.1","version":4}}],"future":[1,2.5e3,{"x":[]}],
 "new_flavor":null,"state_update":{"nova_object.name":"InstanceStateUpdatePayload","nova_object.version":"1.0","nova_object.data":
  {"old_state":"building","state":"active","old_task_state":null,"new_task_state":"spawning"}},"old_display_name":null,"tags":["a","b"]}`

// dataSeeds are instance payload data at the edges of what the fast path
// takes.
var dataSeeds = []struct {
	name string
	data string
	fast bool
}{
	{"base", dataBase, true},
	{"tags empty", strings.Replace(dataBase, `"tags":["a","b"]`, `"tags":[ ]`, 1), true},
	{"tags null", strings.Replace(dataBase, `"tags":["a","b"]`, `"tags":null`, 1), true},
	{"project not a string", strings.Replace(dataBase, `"projects":null`, `"projects":["a",1]`, 1), false},
	{"projects", strings.Replace(dataBase, `"projects":null`, `"projects":["a","b"]`, 1), true},
	{"metadata null", strings.Replace(dataBase, `"metadata":{"k":"v","b":true,"n":null}`, `"metadata":null`, 1), true},
	{"metadata number", strings.Replace(dataBase, `"b":true`, `"b":1.5`, 1), false},
	{"metadata object", strings.Replace(dataBase, `"b":true`, `"b":{}`, 1), false},
	{"metadata non-ASCII key", strings.Replace(dataBase, `"b":true`, `"\u00e9":true`, 1), false},
	{"null string field", strings.Replace(dataBase, `"state":"active"`, `"state":null`, 1), true},
	{"null bool", strings.Replace(dataBase, `"locked":false`, `"locked":null`, 1), true},
	{"string for bool", strings.Replace(dataBase, `"locked":false`, `"locked":"no"`, 1), false},
	{"number for string", strings.Replace(dataBase, `"state":"active"`, `"state":1`, 1), false},
	{"fraction for int", strings.Replace(dataBase, `"vcpus":2`, `"vcpus":2.0`, 1), false},
	{"exponent for int", strings.Replace(dataBase, `"vcpus":2`, `"vcpus":2e0`, 1), false},
	{"int overflow", strings.Replace(dataBase, `"vcpus":2`, `"vcpus":99999999999999999999`, 1), false},
	{"null int", strings.Replace(dataBase, `"vcpus":2`, `"vcpus":null`, 1), true},
	{"bad time", strings.Replace(dataBase, `"2012-10-29T13:42:11Z"`, `"yesterday"`, 1), false},
	{"number time", strings.Replace(dataBase, `"2012-10-29T13:42:11Z"`, `12`, 1), false},
	{"case-folded key", strings.Replace(dataBase, `"display_name"`, `"Display_Name"`, 1), false},
	{"case-folded nested key", strings.Replace(dataBase, `"flavorid"`, `"FlavorID"`, 1), false},
	{"escaped key", strings.Replace(dataBase, `"display_name"`, `"display\u005fname"`, 1), true},
	{"repeated key", strings.Replace(dataBase, `"user_id":"u1"`, `"user_id":"u0","user_id":"u1"`, 1), false},
	{"repeated nested key", strings.Replace(dataBase, `"vcpus":2`, `"vcpus":1,"vcpus":2`, 1), false},
	{"flavor null", strings.Replace(dataBase, `"flavor":{`, `"flavor":null,"x":{`, 1), true},
	{"flavor data null", strings.Replace(dataBase, `"new_flavor":null`, `"new_flavor":{"nova_object.name":"FlavorPayload","nova_object.data":null}`, 1), true},
	{"fault twice", strings.Replace(dataBase, `"ip_addresses"`, `"fault":null,"i"`, 1), false},
	{"flavor data a string", strings.Replace(dataBase, `"nova_object.data":{"exception"`, `"nova_object.data":"x","y":{"exception"`, 1), false},
	{"extra spec null", strings.Replace(dataBase, `{"resources:VGPU":"1"}`, `{"resources:VGPU":null}`, 1), false},
	{"surrogate", strings.Replace(dataBase, `"vm"`, `"\ud83d\ude00"`, 1), false},
	{"empty", `{}`, true},
}

func TestFastDataEdges(t *testing.T) {
	for _, name := range []string{"InstanceActionPayload", "InstanceUpdatePayload"} {
		for _, tc := range dataSeeds {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				if !json.Valid([]byte(tc.data)) {
					t.Fatal("seed is not JSON")
				}
				_, ok := nova.DecodeDataFast(name, []byte(tc.data))
				if ok != tc.fast {
					t.Errorf("fast path took it: %v, want %v", ok, tc.fast)
				}
				checkSameData(t, name, []byte(tc.data))
			})
		}
	}
}

// checkSameData fails when the fast path decodes data differently from
// encoding/json.
func checkSameData(t *testing.T, name string, data []byte) {
	t.Helper()
	fp, ok := nova.DecodeDataFast(name, data)
	if !ok {
		return
	}
	rp, err := nova.DecodeDataReference(name, data)
	if err != nil {
		t.Fatalf("fast path took what encoding/json refuses: %v", err)
	}
	if !reflect.DeepEqual(fp, rp) {
		t.Fatalf("fast path decoded\n%#v\nencoding/json\n%#v", fp, rp)
	}
}

// TestFastDataSamples: the fast path takes the data of every instance and
// flavor sample, and decodes it as encoding/json does.
func TestFastDataSamples(t *testing.T) {
	samples, err := novatest.Samples(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range samples {
		m, err := nova.Decode(s.Wire("id-"+s.Name, time.Unix(1714564800, 0)))
		if err != nil {
			continue
		}
		if _, ok := nova.DecodeDataFast(m.Payload.Name, m.Payload.Data); ok {
			n++
		} else if m.Payload.Name == "FlavorPayload" || nova.IsInstanceAction(m.Payload.Name) || m.Payload.Name == "InstanceUpdatePayload" {
			t.Errorf("%s: the fast path left %s to encoding/json", s.Name, m.Payload.Name)
		}
		checkSameData(t, m.Payload.Name, m.Payload.Data)
	}
	if n < 100 {
		t.Errorf("the fast path took %d samples, want at least 100", n)
	}
}

// FuzzFastData: whatever payload data the fast path takes, encoding/json
// takes too and decodes the same way.
func FuzzFastData(f *testing.F) {
	for _, tc := range dataSeeds {
		f.Add(uint8(0), []byte(tc.data))
		f.Add(uint8(1), []byte(tc.data))
	}
	if samples, err := novatest.Samples(samplesDir); err == nil {
		for i, s := range samples {
			if m, err := nova.Decode(s.Wire("id", time.Unix(1714564800, 0))); err == nil && i%3 == 0 {
				f.Add(uint8(i), []byte(m.Payload.Data))
			}
		}
	}
	names := []string{"InstanceActionPayload", "InstanceUpdatePayload", "FlavorPayload", "InstanceActionResizePrepPayload"}
	// Broken JSON too: DecodeObject's other callers hand on data the
	// envelope's scan did not check.
	f.Add(uint8(0), []byte(`{"uuid":"x"} x`))
	f.Add(uint8(0), []byte(`{"uuid":"x",}`))
	f.Add(uint8(2), []byte(`{"vcpus":01}`))
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		checkSameData(t, names[int(which)%len(names)], data)
	})
}
