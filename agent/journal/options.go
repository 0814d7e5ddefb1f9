package journal

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [DEFAULT] options of the journal, declared once
// with their defaults: the agent's set takes them from OptionGroup, and the
// defaults of the fields they set come from them.
var options = conf.NewGroup()

var (
	optRetention = options.Duration(conf.DefaultSection, "journal_retention", 24*time.Hour, time.Hour, 30*24*time.Hour,
		"How long the result of a finished command is kept in the journal (past its expiry too) to answer a "+
			"duplicate delivery with the recorded result instead of executing it again. Example: 72h")
)

// OptionGroup returns the options of the journal (Options is the type
// Open takes).
func OptionGroup() *conf.Group { return options }

// OptionsFrom maps the journal's [DEFAULT] options to Options; Open fills
// the fields left zero.
func OptionsFrom(v *conf.Values) Options { return Options{Retention: optRetention.Get(v)} }

// defaults are the values of a configuration that sets nothing.
var defaults = sync.OnceValue(func() Options { return OptionsFrom(conf.Defaults(options)) })
