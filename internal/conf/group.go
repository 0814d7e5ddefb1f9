package conf

import (
	"fmt"
	"time"
)

// Group is the options of one feature, each declared once with its type,
// default, range and help text, in the package whose code reads them. It
// registers nothing: a daemon assembles its Set from its features' groups
// (NewSet), and a feature's defaults come from the same declarations
// (Defaults).
type Group struct {
	opts      []*Option
	templates []template
	secHelp   map[string]string
	checks    []func(*Values) Errors
}

type template struct {
	prefix, help string
	opts         []*Option
}

// NewGroup returns a group with no options.
func NewGroup() *Group { return &Group{secHelp: make(map[string]string)} }

// SectionHelp documents a section in the generated sample, and returns g.
func (g *Group) SectionHelp(section, help string) *Group {
	g.secHelp[section] = help
	return g
}

// Template declares the options of a templated section "[prefix:NAME]",
// and returns g. Each option's Section is set to the prefix.
func (g *Group) Template(prefix, help string, opts ...Option) *Group {
	t := template{prefix: prefix, help: help}
	for i := range opts {
		o := opts[i]
		o.Section = prefix
		if o.Help == "" {
			panic(fmt.Sprintf("conf: option [%s:*] %s has no help text", prefix, o.Name))
		}
		t.opts = append(t.opts, &o)
	}
	g.templates = append(g.templates, t)
	return g
}

// WithCheck returns a copy of g whose Set also runs check, a test of
// relations between options, once every value parsed (Set.Check). The
// check is attached where the group is handed to the daemon, since it
// reads the group's own handles.
func (g *Group) WithCheck(check func(*Values) Errors) *Group {
	c := *g
	c.checks = append(append([]func(*Values) Errors(nil), g.checks...), check)
	return &c
}

func (g *Group) add(o Option) *Option {
	if o.Help == "" {
		panic(fmt.Sprintf("conf: option %s has no help text", o.key()))
	}
	if o.Default != "" {
		if _, err := parseValue(&o, o.Default); err != nil {
			panic(fmt.Sprintf("conf: option %s: bad default: %v", o.key(), err))
		}
	}
	p := &o
	g.opts = append(g.opts, p)
	return p
}

// Defaults returns the values of groups' options as a file that sets
// nothing gives them: every option at its default. A feature builds its
// default Config from it, so that each default is written once, in the
// option's declaration.
func Defaults(groups ...*Group) *Values {
	v, err := NewSet("", groups...).Load(Source{})
	if v == nil {
		panic(fmt.Sprintf("conf: defaults: %v", err))
	}
	return v
}

// String declares a string option.
func (g *Group) String(section, name, def, help string) String {
	return String{g.add(Option{Section: section, Name: name, Kind: KindString, Default: def, Help: help})}
}

// Secret declares a string option whose value is never printed.
func (g *Group) Secret(section, name, help string) String {
	return String{g.add(Option{Section: section, Name: name, Kind: KindString, Help: help, Secret: true})}
}

// Choice declares a string option limited to choices.
func (g *Group) Choice(section, name, def string, choices []string, help string) String {
	return String{g.add(Option{Section: section, Name: name, Kind: KindChoice, Default: def, Choices: choices, Help: help})}
}

// Int declares an integer option bounded by [min, max].
func (g *Group) Int(section, name string, def, min, max int, help string) Int {
	return Int{g.add(Option{Section: section, Name: name, Kind: KindInt, Default: itoa(def), Help: help,
		Min: float64(min), Max: float64(max), HasRange: true})}
}

// Float declares a floating point option bounded by [min, max].
func (g *Group) Float(section, name string, def, min, max float64, help string) Float {
	return Float{g.add(Option{Section: section, Name: name, Kind: KindFloat, Default: ftoa(def), Help: help,
		Min: min, Max: max, HasRange: true})}
}

// Bool declares a boolean option.
func (g *Group) Bool(section, name string, def bool, help string) Bool {
	d := "false"
	if def {
		d = "true"
	}
	return Bool{g.add(Option{Section: section, Name: name, Kind: KindBool, Default: d, Help: help})}
}

// Duration declares a duration option bounded by [min, max].
func (g *Group) Duration(section, name string, def, min, max time.Duration, help string) Duration {
	return Duration{g.add(Option{Section: section, Name: name, Kind: KindDuration, Default: def.String(), Help: help,
		Min: float64(min), Max: float64(max), HasRange: true})}
}

// List declares a comma-separated list option.
func (g *Group) List(section, name, def, help string) List {
	return List{g.add(Option{Section: section, Name: name, Kind: KindList, Default: def, Help: help})}
}
