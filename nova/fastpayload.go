package nova

import "strconv"

// The fast path of (*Message).Decode for the payloads most notifications
// carry: the instance payloads (InstanceActionPayload and its variants,
// InstanceUpdatePayload) and FlavorPayload. encoding/json scans the data
// twice (once to validate, once to decode, by reflection); fastData reads
// it once, straight into the structs.
//
// Like fastWire it takes only the shape that decodes without surprises:
// each field of the type it expects (or null), no repeated known key, no
// key that matches a field only case-insensitively, strings valid UTF-8
// without escaped surrogates, metadata values strings, booleans or null,
// extra_specs values strings. For anything else it reports !ok and the
// reference path (encoding/json) decides, with its precise errors;
// FuzzFastData checks that both give the same payload for what fastData
// takes. It checks the grammar of all it reads and skips, so it takes no
// broken JSON either (DecodeObject's other callers hand it data the
// envelope's scan did not see).

// fastData decodes data into v (*InstanceAction, *InstanceUpdate or
// *Flavor); v is changed only when ok.
func fastData(data []byte, v any) bool {
	s := scanner{b: data}
	switch p := v.(type) {
	case *InstanceAction:
		var x InstanceAction
		var seen uint64
		ok := s.object(func(k []byte) bool {
			if string(k) == "new_flavor" {
				return first(&seen, 63) && nestedField(&s, &x.RawNewFlavor, (*scanner).flavor)
			}
			return s.instanceField(k, &x.Instance, &seen, instanceActionKeys)
		})
		if !ok || !s.end() {
			return false
		}
		x.Name = p.Name
		*p = x
	case *InstanceUpdate:
		var x InstanceUpdate
		var seen uint64
		ok := s.object(func(k []byte) bool {
			switch string(k) {
			case "state_update":
				return first(&seen, 63) && nestedField(&s, &x.RawStateUpdate, (*scanner).stateUpdate)
			case "old_display_name":
				return first(&seen, 62) && s.strField(&x.OldDisplayName)
			case "tags":
				return first(&seen, 61) && s.strSlice(&x.Tags)
			}
			return s.instanceField(k, &x.Instance, &seen, instanceUpdateKeys)
		})
		if !ok || !s.end() {
			return false
		}
		*p = x
	case *Flavor:
		var x Flavor
		if !s.flavor(&x) || !s.end() {
			return false
		}
		*p = x
	default:
		return false
	}
	return true
}

// Keys of the structs, for the case-insensitive matches encoding/json
// makes (left to it).
var (
	instanceKeys = []string{"uuid", "tenant_id", "user_id", "host", "node", "display_name", "host_name",
		"availability_zone", "state", "task_state", "power_state", "flavor", "fault", "image_uuid", "locked",
		"created_at", "launched_at", "updated_at", "terminated_at", "deleted_at", "request_id",
		"action_initiator_user", "action_initiator_project", "metadata"}
	instanceActionKeys = append(append([]string(nil), instanceKeys...), "new_flavor")
	instanceUpdateKeys = append(append([]string(nil), instanceKeys...), "state_update", "old_display_name", "tags")
	flavorKeys         = []string{"flavorid", "name", "vcpus", "memory_mb", "root_gb", "ephemeral_gb", "swap",
		"disabled", "is_public", "extra_specs", "projects", "description"}
	exceptionKeys   = []string{"exception", "exception_message", "function_name", "module_name", "traceback"}
	stateUpdateKeys = []string{"old_state", "state", "old_task_state", "new_task_state"}
	nestedKeys      = []string{"nova_object.name", "nova_object.version", "nova_object.data"}
)

// first marks field bit as seen; false when it was (a repeated key, which
// encoding/json merges: left to it).
func first(seen *uint64, bit uint) bool {
	if *seen&(1<<bit) != 0 {
		return false
	}
	*seen |= 1 << bit
	return true
}

// instanceField reads the value of key k of an Instance; keys is the
// whole struct's keys (with those of the payload embedding it).
func (s *scanner) instanceField(k []byte, in *Instance, seen *uint64, keys []string) bool {
	var bit uint
	var ok bool
	switch string(k) {
	case "uuid":
		bit, ok = 0, s.strValue(&in.UUID)
	case "tenant_id":
		bit, ok = 1, s.strValue(&in.TenantID)
	case "user_id":
		bit, ok = 2, s.strValue(&in.UserID)
	case "host":
		bit, ok = 3, s.strField(&in.Host)
	case "node":
		bit, ok = 4, s.strField(&in.Node)
	case "display_name":
		bit, ok = 5, s.strValue(&in.DisplayName)
	case "host_name":
		bit, ok = 6, s.strValue(&in.HostName)
	case "availability_zone":
		bit, ok = 7, s.strField(&in.AvailabilityZone)
	case "state":
		bit, ok = 8, s.strValue(&in.State)
	case "task_state":
		bit, ok = 9, s.strField(&in.TaskState)
	case "power_state":
		bit, ok = 10, s.strValue(&in.PowerState)
	case "flavor":
		bit, ok = 11, nestedField(s, &in.RawFlavor, (*scanner).flavor)
	case "fault":
		bit, ok = 12, nestedField(s, &in.RawFault, (*scanner).exception)
	case "image_uuid":
		bit, ok = 13, s.strValue(&in.ImageUUID)
	case "locked":
		bit, ok = 14, s.boolValue(&in.Locked)
	case "created_at":
		bit, ok = 15, s.timeValue(&in.CreatedAt)
	case "launched_at":
		bit, ok = 16, s.timeValue(&in.LaunchedAt)
	case "updated_at":
		bit, ok = 17, s.timeValue(&in.UpdatedAt)
	case "terminated_at":
		bit, ok = 18, s.timeValue(&in.TerminatedAt)
	case "deleted_at":
		bit, ok = 19, s.timeValue(&in.DeletedAt)
	case "request_id":
		bit, ok = 20, s.strValue(&in.RequestID)
	case "action_initiator_user":
		bit, ok = 21, s.strValue(&in.InitiatorUser)
	case "action_initiator_project":
		bit, ok = 22, s.strValue(&in.InitiatorProject)
	case "metadata":
		bit, ok = 23, s.anyMap(&in.Metadata)
	default:
		return !foldsTo(k, keys) && s.skipValue(3)
	}
	return ok && first(seen, bit)
}

func (s *scanner) flavor(f *Flavor) bool {
	var seen uint64
	return s.object(func(k []byte) bool {
		var bit uint
		var ok bool
		switch string(k) {
		case "flavorid":
			bit, ok = 0, s.strValue(&f.FlavorID)
		case "name":
			bit, ok = 1, s.strValue(&f.Name)
		case "vcpus":
			bit, ok = 2, s.intValue(&f.VCPUs)
		case "memory_mb":
			bit, ok = 3, s.intValue(&f.MemoryMB)
		case "root_gb":
			bit, ok = 4, s.intValue(&f.RootGB)
		case "ephemeral_gb":
			bit, ok = 5, s.intValue(&f.EphemeralGB)
		case "swap":
			bit, ok = 6, s.intValue(&f.Swap)
		case "disabled":
			bit, ok = 7, s.boolValue(&f.Disabled)
		case "is_public":
			bit, ok = 8, s.boolValue(&f.IsPublic)
		case "extra_specs":
			bit, ok = 9, s.strMap(&f.ExtraSpecs)
		case "projects":
			bit, ok = 10, s.strSlice(&f.Projects)
		case "description":
			bit, ok = 11, s.strField(&f.Description)
		default:
			return !foldsTo(k, flavorKeys) && s.skipValue(4)
		}
		return ok && first(&seen, bit)
	})
}

func (s *scanner) exception(e *Exception) bool {
	var seen uint64
	return s.object(func(k []byte) bool {
		var bit uint
		var ok bool
		switch string(k) {
		case "exception":
			bit, ok = 0, s.strValue(&e.Exception)
		case "exception_message":
			bit, ok = 1, s.strValue(&e.ExceptionMessage)
		case "function_name":
			bit, ok = 2, s.strValue(&e.FunctionName)
		case "module_name":
			bit, ok = 3, s.strValue(&e.ModuleName)
		case "traceback":
			bit, ok = 4, s.strValue(&e.Traceback)
		default:
			return !foldsTo(k, exceptionKeys) && s.skipValue(4)
		}
		return ok && first(&seen, bit)
	})
}

func (s *scanner) stateUpdate(u *StateUpdate) bool {
	var seen uint64
	return s.object(func(k []byte) bool {
		var bit uint
		var ok bool
		switch string(k) {
		case "old_state":
			bit, ok = 0, s.strValue(&u.OldState)
		case "state":
			bit, ok = 1, s.strValue(&u.State)
		case "old_task_state":
			bit, ok = 2, s.strField(&u.OldTaskState)
		case "new_task_state":
			bit, ok = 3, s.strField(&u.NewTaskState)
		default:
			return !foldsTo(k, stateUpdateKeys) && s.skipValue(4)
		}
		return ok && first(&seen, bit)
	})
}

// nestedField reads a nested nova_object (or null) into *dst, its data
// with data.
func nestedField[T any](s *scanner, dst **Nested[T], data func(*scanner, *T) bool) bool {
	s.ws()
	if s.peek() == 'n' {
		*dst = nil
		return s.literal("null")
	}
	n := &Nested[T]{}
	var seen uint64
	ok := s.object(func(k []byte) bool {
		switch string(k) {
		case "nova_object.name":
			return first(&seen, 0) && s.strValue(&n.Name)
		case "nova_object.version":
			return first(&seen, 1) && s.strValue(&n.Version)
		case "nova_object.data":
			if !first(&seen, 2) {
				return false
			}
			s.ws()
			if s.peek() == 'n' {
				n.Data = nil
				return s.literal("null")
			}
			n.Data = new(T)
			return data(s, n.Data)
		}
		return !foldsTo(k, nestedKeys) && s.skipValue(3)
	})
	*dst = n
	return ok
}

// strValue reads a string into *p; null leaves *p as it is (as
// encoding/json does for a string field).
func (s *scanner) strValue(p *string) bool {
	s.ws()
	if s.peek() == 'n' {
		return s.literal("null")
	}
	b, ok := s.str()
	if ok {
		*p = string(b)
	}
	return ok
}

// boolValue reads true or false into *p; null leaves it.
func (s *scanner) boolValue(p *bool) bool {
	s.ws()
	switch s.peek() {
	case 't':
		*p = true
		return s.literal("true")
	case 'f':
		*p = false
		return s.literal("false")
	case 'n':
		return s.literal("null")
	}
	return false
}

// intValue reads an integer into *p; null leaves it. A number with a
// fraction or an exponent, or out of range, is left to encoding/json (an
// error).
func (s *scanner) intValue(p *int) bool {
	s.ws()
	if s.peek() == 'n' {
		return s.literal("null")
	}
	start := s.i
	if !s.number() {
		return false
	}
	n, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	if err != nil {
		return false
	}
	*p = int(n)
	return true
}

// timeValue gives the raw value to Time.UnmarshalJSON, as encoding/json
// does; an error is left to encoding/json.
func (s *scanner) timeValue(p *Time) bool {
	s.ws()
	start := s.i
	if !s.skipValue(4) {
		return false
	}
	return p.UnmarshalJSON(s.b[start:s.i]) == nil
}

// strSlice reads an array of strings (a new, non-nil slice) or null (nil).
func (s *scanner) strSlice(p *[]string) bool {
	s.ws()
	if s.peek() == 'n' {
		*p = nil
		return s.literal("null")
	}
	if !s.eat('[') {
		return false
	}
	out := []string{}
	if !s.eat(']') {
		for {
			s.ws()
			b, ok := s.str()
			if !ok {
				return false
			}
			out = append(out, string(b))
			if s.eat(',') {
				continue
			}
			if !s.eat(']') {
				return false
			}
			break
		}
	}
	*p = out
	return true
}

// strMap reads an object of strings (a new map) or null (nil).
func (s *scanner) strMap(p *map[string]string) bool {
	s.ws()
	if s.peek() == 'n' {
		*p = nil
		return s.literal("null")
	}
	m := map[string]string{}
	if !s.object(func(k []byte) bool {
		s.ws()
		b, ok := s.str()
		m[string(k)] = string(b)
		return ok
	}) {
		return false
	}
	*p = m
	return true
}

// anyMap reads an object of strings, booleans and nulls (a new map) or
// null (nil).
func (s *scanner) anyMap(p *map[string]any) bool {
	s.ws()
	if s.peek() == 'n' {
		*p = nil
		return s.literal("null")
	}
	m := map[string]any{}
	if !s.object(func(k []byte) bool {
		s.ws()
		switch s.peek() {
		case '"':
			b, ok := s.str()
			m[string(k)] = string(b)
			return ok
		case 't':
			m[string(k)] = true
			return s.literal("true")
		case 'f':
			m[string(k)] = false
			return s.literal("false")
		case 'n':
			m[string(k)] = nil
			return s.literal("null")
		}
		return false
	}) {
		return false
	}
	*p = m
	return true
}
