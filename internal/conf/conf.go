// Package conf defines, loads and documents daemon options in the style of
// oslo.config: one INI file per daemon with [DEFAULT] and named sections,
// environment overrides and command-line overrides, every option declared
// once in code with its type, default and help text.
//
// Precedence, lowest first: defaults, the file, the environment
// (PREFIX_SECTION_OPTION), flags. Templated sections such as
// [webhook_source:NAME] come from the file only.
package conf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/ini.v1"
)

// DefaultSection is the name of the INI section without a name.
const DefaultSection = "DEFAULT"

// Kind is the type of an option's value.
type Kind int

// Option kinds.
const (
	KindString Kind = iota
	KindInt
	KindFloat
	KindBool
	KindDuration
	KindList
	KindChoice
)

func (k Kind) String() string {
	switch k {
	case KindInt:
		return "integer"
	case KindFloat:
		return "floating point"
	case KindBool:
		return "boolean"
	case KindDuration:
		return "duration"
	case KindList:
		return "list"
	case KindChoice:
		return "string"
	}
	return "string"
}

// Option is one declared option. Use the typed constructors on Group.
type Option struct {
	Section string
	Name    string
	Kind    Kind
	Default string
	Help    string
	Choices []string
	// Secret options are shown as "***" wherever values are printed.
	Secret bool
	// Min and Max bound integer, float and duration values when HasRange.
	Min, Max float64
	HasRange bool
	// Required options must be set to a non-empty value.
	Required bool
	// Aliases are the option's other names in the file: oslo's names for
	// the same setting, so that nova.conf's sections can be pasted
	// (Option.also, oslo.go).
	Aliases []Alias
}

func (o *Option) key() string { return o.Section + "." + o.Name }

// Set is the collection of options of one daemon, assembled from its
// features' groups.
type Set struct {
	envPrefix string
	opts      map[string]*Option // section.name
	order     []string
	templates map[string][]*Option
	secHelp   map[string]string
	renamed   map[string]string    // old section.name → new section.name ("" removed)
	aliases   map[string][]*Option // other section.name in the file → the options it sets
	checks    []func(*Values) Errors
}

// NewSet returns the option set made of groups, whose environment
// variables start with envPrefix (for example "VGPU_BRIDGE"). An option
// declared by two groups is a programming error (a panic).
func NewSet(envPrefix string, groups ...*Group) *Set {
	s := &Set{
		envPrefix: envPrefix,
		opts:      make(map[string]*Option),
		templates: make(map[string][]*Option),
		renamed:   make(map[string]string),
		aliases:   make(map[string][]*Option),
		secHelp:   make(map[string]string),
	}
	for _, g := range groups {
		for _, o := range g.opts {
			s.add(o)
		}
		for _, t := range g.templates {
			s.templates[t.prefix] = append(s.templates[t.prefix], t.opts...)
			s.secHelp[t.prefix+":*"] = t.help
		}
		for sec, h := range g.secHelp {
			s.secHelp[sec] = h
		}
		s.checks = append(s.checks, g.checks...)
	}
	for a := range s.aliases {
		if s.opts[a] != nil {
			panic(fmt.Sprintf("conf: alias %s is also an option's name", a))
		}
	}
	return s
}

// EnvPrefix returns the prefix of the set's environment variables.
func (s *Set) EnvPrefix() string { return s.envPrefix }

func (s *Set) add(o *Option) {
	if _, dup := s.opts[o.key()]; dup {
		panic(fmt.Sprintf("conf: option %s declared twice", o.key()))
	}
	s.opts[o.key()] = o
	s.order = append(s.order, o.key())
	for _, a := range o.Aliases {
		s.aliases[a.key()] = append(s.aliases[a.key()], o)
	}
}

// Check runs the groups' checks of relations between options
// (Group.WithCheck) on values loaded by Load, in the groups' order.
func (s *Set) Check(v *Values) Errors {
	var errs Errors
	for _, f := range s.checks {
		errs = append(errs, f(v)...)
	}
	return errs
}

// Options returns all plain options, sorted by section (DEFAULT first) and name.
func (s *Set) Options() []*Option {
	out := make([]*Option, 0, len(s.opts))
	for _, k := range s.order {
		out = append(out, s.opts[k])
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Section != b.Section {
			return sectionLess(a.Section, b.Section)
		}
		return a.Name < b.Name
	})
	return out
}

func sectionLess(a, b string) bool {
	if a == DefaultSection {
		return b != DefaultSection
	}
	if b == DefaultSection {
		return false
	}
	return a < b
}

// Lookup returns the option declared as section.name, or nil.
func (s *Set) Lookup(section, name string) *Option { return s.opts[section+"."+name] }

// Values holds the loaded value of every option.
type Values struct {
	set       *Set
	vals      map[string]any
	raw       map[string]string
	source    map[string]string
	instances map[string][]*Instance
	// Warnings lists things worth logging that did not stop the load:
	// options that were renamed or removed (Set.Deprecated).
	Warnings []string
	viaOld   map[string]bool // options last set through a deprecated name
}

// Instance is one templated section, e.g. [webhook_source:batch].
type Instance struct {
	Name string
	vals map[string]any
	raw  map[string]string
}

// Error is one configuration problem.
type Error struct {
	Section, Option, Value string
	Problem                string
	Secret                 bool
}

func (e *Error) Error() string {
	v := e.Value
	if e.Secret && v != "" {
		v = "***"
	}
	if e.Option == "" {
		return fmt.Sprintf("[%s]: %s", e.Section, e.Problem)
	}
	return fmt.Sprintf("[%s] %s = %q: %s", e.Section, e.Option, v, e.Problem)
}

// Errors is every problem found while loading; Load returns it when non-empty.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// AsErrors returns the individual problems of err when it came from Load.
func AsErrors(err error) (Errors, bool) {
	var es Errors
	ok := errors.As(err, &es)
	return es, ok
}

// Source describes where the configuration comes from.
type Source struct {
	// File is the INI file; empty means none. A missing file is an error.
	File string
	// Dir is a directory of drop-in files (oslo.config's --config-dir):
	// every *.conf in it, in name order, read after File; where two files
	// set an option, the later one wins. Empty means none; a missing
	// directory is an error.
	Dir string
	// Environ is the environment, as os.Environ returns it.
	Environ []string
	// Overrides are "section.option=value" settings from flags, applied last.
	Overrides []string
}

// Load reads defaults, then the file, environment and overrides, and
// validates every value. All problems are reported together as Errors;
// the Values returned with them hold defaults in place of the bad values,
// so that callers can run their own checks and report everything at once.
func (s *Set) Load(src Source) (*Values, error) {
	v := &Values{
		set:       s,
		vals:      make(map[string]any),
		raw:       make(map[string]string),
		source:    make(map[string]string),
		instances: make(map[string][]*Instance),
	}
	var errs Errors
	for k, o := range s.opts {
		v.raw[k] = o.Default
		v.source[k] = "default"
	}
	files, err := src.files()
	if err != nil {
		errs = append(errs, &Error{Section: "file", Option: "--config-dir", Value: src.Dir, Problem: err.Error()})
	}
	if len(files) > 0 {
		errs = append(errs, s.loadFile(v, files)...)
	}
	prefix := s.envPrefix + "_"
	for _, kv := range src.Environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		o := s.envOption(strings.TrimPrefix(name, prefix))
		if o == nil {
			if old := s.envRenamed(strings.TrimPrefix(name, prefix)); old != "" {
				if o = s.deprecated(v, old, "environment "+name); o == nil {
					continue
				}
			} else {
				errs = append(errs, &Error{Section: "environment", Option: name, Problem: "names no option" + s.nearestEnv(strings.TrimPrefix(name, prefix))})
				continue
			}
		}
		v.raw[o.key()] = val
		v.source[o.key()] = "environment " + name
	}
	for _, ov := range src.Overrides {
		k, val, ok := strings.Cut(ov, "=")
		sec, name, ok2 := strings.Cut(strings.TrimSpace(k), ".")
		if !ok || !ok2 {
			errs = append(errs, &Error{Section: "flags", Option: "--set", Value: ov, Problem: "want SECTION.OPTION=VALUE"})
			continue
		}
		o := s.Lookup(sec, name)
		if o == nil {
			if _, old := s.renamed[sec+"."+name]; old {
				if o = s.deprecated(v, sec+"."+name, "flag --set "+k); o == nil {
					continue
				}
			} else {
				errs = append(errs, &Error{Section: sec, Option: name, Value: val, Problem: "no such option" + s.nearestOption(sec, name)})
				continue
			}
		}
		v.raw[o.key()] = val
		v.source[o.key()] = "flag"
	}
	for k, o := range s.opts {
		raw := v.raw[k]
		if raw == "" {
			if o.Required {
				errs = append(errs, &Error{Section: o.Section, Option: o.Name, Problem: "is required; " + o.allowed()})
			}
			v.vals[k], _ = parseValue(o, "")
			continue
		}
		x, err := parseValue(o, raw)
		if err != nil {
			problem := err.Error() + "; " + o.allowed()
			if _, alias, ok := strings.Cut(v.source[k], " as ["); ok {
				problem += " (set as [" + alias + ")"
			}
			errs = append(errs, &Error{Section: o.Section, Option: o.Name, Value: raw, Problem: problem, Secret: o.Secret})
			// Keep the default so checks across options can still run.
			v.vals[k], _ = parseValue(o, o.Default)
			continue
		}
		v.vals[k] = x
	}
	if len(errs) > 0 {
		errs.Sort()
		return v, errs
	}
	return v, nil
}

// Sort orders problems by section (DEFAULT first) and option.
func (es Errors) Sort() {
	sort.SliceStable(es, func(i, j int) bool {
		if es[i].Section != es[j].Section {
			return sectionLess(es[i].Section, es[j].Section)
		}
		return es[i].Option < es[j].Option
	})
}

func (s *Set) envOption(rest string) *Option {
	for _, o := range s.opts {
		if strings.EqualFold(envName(o.Section, o.Name), rest) {
			return o
		}
	}
	return nil
}

func envName(section, name string) string {
	r := strings.NewReplacer("-", "_", ".", "_", ":", "_")
	return strings.ToUpper(r.Replace(section) + "_" + r.Replace(name))
}

// EnvVar returns the environment variable that overrides o.
func (s *Set) EnvVar(o *Option) string { return s.envPrefix + "_" + envName(o.Section, o.Name) }

// files are the configuration files of src in the order they are read.
func (src Source) files() ([]string, error) {
	var files []string
	if src.File != "" {
		files = append(files, src.File)
	}
	if src.Dir == "" {
		return files, nil
	}
	if st, err := os.Stat(src.Dir); err != nil {
		return files, err
	} else if !st.IsDir() {
		return files, fmt.Errorf("%s is not a directory", src.Dir)
	}
	more, err := filepath.Glob(filepath.Join(src.Dir, "*.conf"))
	if err != nil {
		return files, err
	}
	sort.Strings(more)
	return append(files, more...), nil
}

// loadFile reads the INI files, merged in order (a later file's value of
// an option wins, sections of the same name are one).
func (s *Set) loadFile(v *Values, files []string) Errors {
	path := strings.Join(files, ", ")
	where := "file " + path // where an option's value came from
	if len(files) > 1 {
		where = "files " + path
	}
	more := make([]any, 0, len(files)-1)
	for _, f := range files[1:] {
		more = append(more, f)
	}
	f, err := ini.LoadSources(ini.LoadOptions{
		AllowPythonMultilineValues: true,
		SpaceBeforeInlineComment:   true,
		Insensitive:                false,
	}, files[0], more...)
	if err != nil {
		return Errors{{Section: "file", Option: "--config", Value: path, Problem: err.Error()}}
	}
	var errs Errors
	var viaAlias []aliasValue
	ignored := map[string][]string{} // section → oslo options read and ignored
	for _, sec := range f.Sections() {
		name := sec.Name()
		if prefix, inst, ok := s.templateOf(name); ok {
			tmpl, known := s.templates[prefix]
			if !known {
				errs = append(errs, &Error{Section: name, Problem: "no such section" + s.nearestSection(name)})
				continue
			}
			in, es := loadInstance(prefix, inst, tmpl, sec)
			errs = append(errs, es...)
			v.instances[prefix] = append(v.instances[prefix], in)
			continue
		}
		for _, key := range sec.Keys() {
			o := s.Lookup(name, key.Name())
			if o == nil {
				if targets := s.aliases[name+"."+key.Name()]; targets != nil {
					viaAlias = append(viaAlias, aliasValue{Alias{name, key.Name()}, strings.TrimSpace(key.Value()), targets})
					continue
				}
				if s.ignoredOslo(name, key.Name()) {
					ignored[name] = append(ignored[name], key.Name())
					continue
				}
				if _, old := s.renamed[name+"."+key.Name()]; old {
					if o = s.deprecated(v, name+"."+key.Name(), where); o == nil {
						continue
					}
				} else if !s.hasSection(name) {
					errs = append(errs, &Error{Section: name, Problem: "no such section" + s.nearestSection(name)})
					break
				} else {
					errs = append(errs, &Error{Section: name, Option: key.Name(), Value: key.Value(), Problem: "no such option" + s.nearestOption(name, key.Name())})
					continue
				}
			}
			v.raw[o.key()] = strings.TrimSpace(key.Value())
			v.source[o.key()] = where
		}
	}
	errs = append(errs, s.applyAliases(v, viaAlias, where)...)
	v.Warnings = append(v.Warnings, s.ignoredWarnings(ignored, where)...)
	for prefix := range v.instances {
		sort.Slice(v.instances[prefix], func(i, j int) bool { return v.instances[prefix][i].Name < v.instances[prefix][j].Name })
	}
	return errs
}

// templateOf splits a section name into template prefix and instance name:
// "[prefix:NAME]", or "[prefixNAME]" for a template whose prefix ends in "_"
// (Nova's "[mdev_nvidia-232]" style).
func (s *Set) templateOf(name string) (prefix, inst string, ok bool) {
	if p, i, ok := strings.Cut(name, ":"); ok {
		return p, i, true
	}
	for p := range s.templates {
		if strings.HasSuffix(p, "_") && len(name) > len(p) && strings.HasPrefix(name, p) {
			return p, name[len(p):], true
		}
	}
	return "", "", false
}

func loadInstance(prefix, name string, tmpl []*Option, sec *ini.Section) (*Instance, Errors) {
	in := &Instance{Name: name, vals: make(map[string]any), raw: make(map[string]string)}
	var errs Errors
	secName := prefix + ":" + name
	if name == "" {
		errs = append(errs, &Error{Section: secName, Problem: "templated section needs a name, e.g. [" + prefix + ":NAME]"})
	}
	known := make(map[string]*Option, len(tmpl))
	for _, o := range tmpl {
		known[o.Name] = o
	}
	for _, key := range sec.Keys() {
		if known[key.Name()] == nil {
			errs = append(errs, &Error{Section: secName, Option: key.Name(), Value: key.Value(), Problem: "no such option in [" + prefix + ":*] sections"})
			continue
		}
		in.raw[key.Name()] = strings.TrimSpace(key.Value())
	}
	for _, o := range tmpl {
		raw, set := in.raw[o.Name]
		if !set {
			raw = o.Default
			in.raw[o.Name] = raw
		}
		if raw == "" && o.Required {
			errs = append(errs, &Error{Section: secName, Option: o.Name, Problem: "is required; " + o.allowed()})
		}
		x, err := parseValue(o, raw)
		if err != nil {
			errs = append(errs, &Error{Section: secName, Option: o.Name, Value: raw, Problem: err.Error() + "; " + o.allowed(), Secret: o.Secret})
			continue
		}
		in.vals[o.Name] = x
	}
	return in, errs
}

func (o *Option) allowed() string {
	switch o.Kind {
	case KindInt, KindFloat, KindDuration:
		a := "allowed: a " + o.Kind.String()
		if o.Kind == KindInt {
			a = "allowed: an integer"
		}
		if o.Kind == KindDuration {
			a = "allowed: a duration such as 30s, 5m or 1h30m"
		}
		if o.HasRange {
			a += fmt.Sprintf(" from %s to %s", o.fmtBound(o.Min), o.fmtBound(o.Max))
		}
		return a
	case KindBool:
		return "allowed: true or false"
	case KindChoice:
		return "allowed: " + strings.Join(o.Choices, ", ")
	case KindList:
		return "allowed: comma-separated values"
	}
	if o.Required {
		return "allowed: a non-empty string"
	}
	return "allowed: a string"
}

func (o *Option) fmtBound(f float64) string {
	if o.Kind == KindDuration {
		return time.Duration(f).String()
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

func parseValue(o *Option, raw string) (any, error) {
	switch o.Kind {
	case KindString:
		return raw, nil
	case KindInt:
		if raw == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(raw)
		if err != nil {
			return nil, errors.New("not an integer")
		}
		if o.HasRange && (float64(n) < o.Min || float64(n) > o.Max) {
			return nil, errors.New("out of range")
		}
		return n, nil
	case KindFloat:
		if raw == "" {
			return 0.0, nil
		}
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return nil, errors.New("not a number")
		}
		if o.HasRange && (f < o.Min || f > o.Max) {
			return nil, errors.New("out of range")
		}
		return f, nil
	case KindBool:
		if raw == "" {
			return false, nil
		}
		switch strings.ToLower(raw) {
		case "true", "yes", "on", "1":
			return true, nil
		case "false", "no", "off", "0":
			return false, nil
		}
		return nil, errors.New("not a boolean")
	case KindDuration:
		if raw == "" {
			return time.Duration(0), nil
		}
		d, err := time.ParseDuration(raw)
		if err != nil {
			// oslo options are often plain seconds.
			n, nerr := strconv.Atoi(raw)
			if nerr != nil {
				return nil, errors.New("not a duration")
			}
			d = time.Duration(n) * time.Second
		}
		if o.HasRange && (float64(d) < o.Min || float64(d) > o.Max) {
			return nil, errors.New("out of range")
		}
		return d, nil
	case KindList:
		var out []string
		for _, p := range strings.Split(raw, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		return out, nil
	case KindChoice:
		for _, c := range o.Choices {
			if raw == c {
				return raw, nil
			}
		}
		return nil, errors.New("not one of the choices")
	}
	return nil, fmt.Errorf("unknown kind %d", o.Kind)
}

// Source reports where the value of section.name came from.
func (v *Values) Source(section, name string) string { return v.source[section+"."+name] }

// Instances returns the templated sections [prefix:NAME], sorted by name.
func (v *Values) Instances(prefix string) []*Instance { return v.instances[prefix] }

// Changed names what differs between v and old, as "[section] name" for
// plain options and "[prefix:NAME] name" for templated ones; a templated
// section that only one of them has is named "[prefix:NAME]". Values are
// compared as loaded (a value equal to the default it replaces is no
// change). The order is stable.
func (v *Values) Changed(old *Values) []string {
	var out []string
	for _, o := range v.set.Options() {
		if fmt.Sprint(v.vals[o.key()]) != fmt.Sprint(old.vals[o.key()]) {
			out = append(out, "["+o.Section+"] "+o.Name)
		}
	}
	for _, prefix := range v.set.templatePrefixes() {
		had := map[string]*Instance{}
		for _, in := range old.instances[prefix] {
			had[in.Name] = in
		}
		for _, in := range v.instances[prefix] {
			was, ok := had[in.Name]
			delete(had, in.Name)
			if !ok {
				out = append(out, "["+prefix+":"+in.Name+"]")
				continue
			}
			for _, o := range v.set.templateOptions(prefix) {
				if fmt.Sprint(in.vals[o.Name]) != fmt.Sprint(was.vals[o.Name]) {
					out = append(out, "["+prefix+":"+in.Name+"] "+o.Name)
				}
			}
		}
		gone := make([]string, 0, len(had))
		for name := range had {
			gone = append(gone, "["+prefix+":"+name+"]")
		}
		sort.Strings(gone)
		out = append(out, gone...)
	}
	return out
}

// Dump returns "[section] name = value (source)" lines for logging, with
// secrets masked.
func (v *Values) Dump() []string {
	var out []string
	for _, o := range v.set.Options() {
		val := v.raw[o.key()]
		if o.Secret && val != "" {
			val = "***"
		}
		out = append(out, fmt.Sprintf("[%s] %s = %s (%s)", o.Section, o.Name, val, v.source[o.key()]))
	}
	return out
}

// ReadSecretFile reads a secret from path, trimming one trailing newline.
// It refuses files readable by others than owner and group.
func ReadSecretFile(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("secret file: %w", err)
	}
	if st.Mode().Perm()&0o004 != 0 {
		return "", fmt.Errorf("secret file %s is world-readable (mode %v); chmod o-r it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("secret file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
