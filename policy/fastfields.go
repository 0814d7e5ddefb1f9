package policy

import (
	"reflect"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
)

// fastFields makes CEL read the scalar fields of the policy's own structs
// (event.workload, instance.vgpu_count, …) through precomputed field
// indexes, returning CEL values directly. ext.NativeTypes would box each
// field into an interface and convert it again on every access; rules read
// these fields on every evaluation.
func fastFields(structs ...reflect.Type) cel.EnvOption {
	return func(env *cel.Env) (*cel.Env, error) {
		inner := env.CELTypeProvider()
		fp := &fastProvider{Provider: inner, fields: map[string]map[string]*types.FieldType{}}
		for _, t := range structs {
			name := "policy." + t.Name()
			m := map[string]*types.FieldType{}
			for i := 0; i < t.NumField(); i++ {
				f := t.Field(i)
				celName, _, _ := strings.Cut(f.Tag.Get("cel"), ",")
				if celName == "" {
					celName = f.Name
				}
				base, ok := inner.FindStructFieldType(name, celName)
				if !ok {
					continue
				}
				get := scalarGetter(i, f.Type.Kind())
				if get == nil {
					continue
				}
				ft := *base
				fallback := base.GetFrom
				ft.GetFrom = func(obj any) (any, error) {
					v := reflect.ValueOf(obj)
					if v.Kind() == reflect.Pointer {
						if v.IsNil() {
							return fallback(obj)
						}
						v = v.Elem()
					}
					if v.Kind() != reflect.Struct || v.Type() != t {
						return fallback(obj)
					}
					return get(v), nil
				}
				m[celName] = &ft
			}
			fp.fields[name] = m
		}
		return cel.CustomTypeProvider(fp)(env)
	}
}

func scalarGetter(i int, k reflect.Kind) func(reflect.Value) any {
	switch k {
	case reflect.String:
		return func(v reflect.Value) any { return types.String(v.Field(i).String()) }
	case reflect.Int, reflect.Int64, reflect.Int32:
		return func(v reflect.Value) any { return types.Int(v.Field(i).Int()) }
	case reflect.Float64:
		return func(v reflect.Value) any { return types.Double(v.Field(i).Float()) }
	case reflect.Bool:
		return func(v reflect.Value) any { return types.Bool(v.Field(i).Bool()) }
	}
	return nil
}

type fastProvider struct {
	types.Provider
	fields map[string]map[string]*types.FieldType
}

func (p *fastProvider) FindStructFieldType(structType, fieldName string) (*types.FieldType, bool) {
	if m, ok := p.fields[structType]; ok {
		if f, ok := m[fieldName]; ok {
			return f, true
		}
	}
	return p.Provider.FindStructFieldType(structType, fieldName)
}
