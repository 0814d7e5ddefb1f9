package policy

import (
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// accessor reads a variable path (event.workload, metrics["gpu_util"])
// straight from the evaluation's Go values, for explanations: much cheaper
// than a CEL program per path.
type accessor struct {
	root  string
	steps []accessStep
}

type accessStep struct {
	field []int  // struct field index
	key   string // map key
	isKey bool
}

var rootTypes = map[string]reflect.Type{
	varEvent:     reflect.TypeOf(Event{}),
	varInstance:  reflect.TypeOf(Instance{}),
	varHost:      reflect.TypeOf(Host{}),
	varProject:   reflect.TypeOf(Project{}),
	varMetrics:   reflect.TypeOf(map[string]float64{}),
	varPreferred: reflect.TypeOf(""),
}

// newAccessor builds an accessor for root and its selections; ok is false
// when the path cannot be read this way (the caller falls back to CEL).
func newAccessor(root string, sels []pathSel) (*accessor, bool) {
	t, ok := rootTypes[root]
	if !ok {
		return nil, false
	}
	a := &accessor{root: root}
	for _, s := range sels {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Struct:
			if s.isKey {
				return nil, false
			}
			f, ok := fieldByCELName(t, s.name)
			if !ok {
				return nil, false
			}
			a.steps = append(a.steps, accessStep{field: f.Index})
			t = f.Type
		case reflect.Map:
			if t.Key().Kind() != reflect.String {
				return nil, false
			}
			a.steps = append(a.steps, accessStep{key: s.name, isKey: true})
			t = t.Elem()
		default:
			return nil, false
		}
	}
	return a, true
}

func fieldByCELName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("cel"), ",")
		if tag == name || tag == "" && f.Name == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// pathSel is one selection of a path: a field, or a map key.
type pathSel struct {
	name  string
	isKey bool
}

// read returns the formatted value, or "<absent>".
func (a *accessor) read(e *evaluation) string {
	var v reflect.Value
	switch a.root {
	case varEvent:
		v = reflect.ValueOf(&e.ev).Elem()
	case varInstance:
		v = reflect.ValueOf(&e.inst).Elem()
	case varHost:
		v = reflect.ValueOf(&e.host).Elem()
	case varProject:
		v = reflect.ValueOf(&e.project).Elem()
	case varMetrics:
		v = reflect.ValueOf(e.ev.Metrics)
	case varPreferred:
		return strconv.Quote(e.d.Preferred)
	}
	for _, s := range a.steps {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return "<absent>"
			}
			v = v.Elem()
		}
		if s.isKey {
			if v.IsNil() {
				return "<absent>"
			}
			v = v.MapIndex(reflect.ValueOf(s.key))
			if !v.IsValid() {
				return "<absent>"
			}
			continue
		}
		v = v.FieldByIndex(s.field)
	}
	return formatReflect(v)
}

func formatReflect(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Type() == reflect.TypeOf(time.Duration(0)) {
			return time.Duration(v.Int()).String()
		}
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Pointer:
		if v.IsNil() {
			return "null"
		}
		return formatReflect(v.Elem())
	case reflect.Map:
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k.String() + ":" + formatReflect(v.MapIndex(k))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = formatReflect(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Struct:
		if t, ok := v.Interface().(time.Time); ok {
			return t.UTC().Format(time.RFC3339)
		}
		var parts []string
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("cel"), ",")
			if name == "" {
				name = f.Name
			}
			parts = append(parts, name+":"+formatReflect(v.Field(i)))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return "<" + v.Kind().String() + ">"
}
