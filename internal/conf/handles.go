package conf

import "time"

// String is a handle to a string option.
type String struct{ o *Option }

// Int is a handle to an integer option.
type Int struct{ o *Option }

// Float is a handle to a floating point option.
type Float struct{ o *Option }

// Bool is a handle to a boolean option.
type Bool struct{ o *Option }

// Duration is a handle to a duration option ("30s", "5m", or plain seconds).
type Duration struct{ o *Option }

// List is a handle to a comma-separated list option.
type List struct{ o *Option }

// Get returns the option's value.
func (h String) Get(v *Values) string { return v.vals[h.o.key()].(string) }

// Get returns the option's value.
func (h Int) Get(v *Values) int { return v.vals[h.o.key()].(int) }

// Get returns the option's value.
func (h Float) Get(v *Values) float64 { return v.vals[h.o.key()].(float64) }

// Get returns the option's value.
func (h Bool) Get(v *Values) bool { return v.vals[h.o.key()].(bool) }

// Get returns the option's value.
func (h Duration) Get(v *Values) time.Duration { return v.vals[h.o.key()].(time.Duration) }

// Get returns the option's value.
func (h List) Get(v *Values) []string {
	l, _ := v.vals[h.o.key()].([]string)
	return l
}

// Option returns the declaration behind a handle.
func (h String) Option() *Option { return h.o }

// Option returns the declaration behind a handle.
func (h Int) Option() *Option { return h.o }

// Option returns the declaration behind a handle.
func (h Float) Option() *Option { return h.o }

// Option returns the declaration behind a handle.
func (h Bool) Option() *Option { return h.o }

// Option returns the declaration behind a handle.
func (h Duration) Option() *Option { return h.o }

// Option returns the declaration behind a handle.
func (h List) Option() *Option { return h.o }

// Also gives the option another name in the file, [section] name: the
// name an oslo library gives the same setting in nova.conf (Set.Alias), and
// returns h.
func (h String) Also(section, name string) String { h.o.also(section, name); return h }

// Also gives the option another name in the file (see String.Also).
func (h Int) Also(section, name string) Int { h.o.also(section, name); return h }

// Also gives the option another name in the file (see String.Also).
func (h Float) Also(section, name string) Float { h.o.also(section, name); return h }

// Also gives the option another name in the file (see String.Also).
func (h Bool) Also(section, name string) Bool { h.o.also(section, name); return h }

// Also gives the option another name in the file (see String.Also).
func (h Duration) Also(section, name string) Duration { h.o.also(section, name); return h }

// Also gives the option another name in the file (see String.Also).
func (h List) Also(section, name string) List { h.o.also(section, name); return h }

// String returns a templated section's string value.
func (in *Instance) String(name string) string { s, _ := in.vals[name].(string); return s }

// Int returns a templated section's integer value.
func (in *Instance) Int(name string) int { n, _ := in.vals[name].(int); return n }

// Float returns a templated section's float value.
func (in *Instance) Float(name string) float64 { f, _ := in.vals[name].(float64); return f }

// Bool returns a templated section's boolean value.
func (in *Instance) Bool(name string) bool { b, _ := in.vals[name].(bool); return b }

// Duration returns a templated section's duration value.
func (in *Instance) Duration(name string) time.Duration {
	d, _ := in.vals[name].(time.Duration)
	return d
}

// List returns a templated section's list value.
func (in *Instance) List(name string) []string { l, _ := in.vals[name].([]string); return l }

// IsSet reports whether the file set name in this section.
func (in *Instance) IsSet(name string) bool { _, ok := in.raw[name]; return ok }
