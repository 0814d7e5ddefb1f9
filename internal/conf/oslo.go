package conf

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
)

// Operators configure vgpu-bridge by copying sections of nova.conf:
// [DEFAULT] transport_url, [oslo_messaging_rabbit], [keystone_authtoken],
// [oslo_messaging_notifications]. So that those sections can be pasted as
// they are:
//
//   - an option whose setting oslo's libraries name otherwise carries that
//     name too (String.Also and the other handles' Also): the file may use
//     either; setting both to different values is an error naming both;
//   - the other options of the oslo sections (oslo_sections below) are read
//     and ignored, with one warning per section at start, since nova.conf's
//     sections hold many settings that mean nothing here;
//   - a name that is neither, in a section of our own ([DEFAULT] included),
//     stays an error: a typo must not pass for an oslo option.

// Alias is another name of an option in the file.
type Alias struct{ Section, Name string }

func (a Alias) key() string { return a.Section + "." + a.Name }

func (a Alias) String() string { return "[" + a.Section + "] " + a.Name }

func (o *Option) also(section, name string) {
	o.Aliases = append(o.Aliases, Alias{section, name})
}

// osloSection is a section of nova.conf that oslo's libraries own.
type osloSection struct {
	// whose is what the section configures in an OpenStack service, and
	// why its other options mean nothing to vgpu-bridge.
	whose string
	// known are option names of the section that oslo's libraries (or
	// Nova) define. In a section the daemon also declares, only these are
	// ignored; any other unknown name is an error. In a section the
	// daemon does not declare every option is ignored, since the
	// libraries define more than this list (plug-in options, new
	// releases).
	known []string
}

// osloSections are the oslo sections a file may hold. The names come from
// oslo.log's _options.py, oslo.messaging's impl_rabbit.py and
// notify/notifier.py, keystonemiddleware's auth_token/_opts.py, oslo.limit's
// opts.py and Nova's conf/notifications.py.
var osloSections = map[string]osloSection{
	DefaultSection: {
		whose: "oslo.log's, oslo.messaging's and oslo.service's process settings; " +
			"vgpu-bridge logs in log_format to log_file or standard error (journald)",
		known: []string{
			// oslo.log
			"verbose", "log_config_append", "log_date_format", "watch_log_file", "use_syslog",
			"use_journal", "syslog_log_facility", "use_json", "use_stderr", "use_eventlog",
			"log_rotate_interval", "log_rotate_interval_type", "max_logfile_count", "max_logfile_size_mb",
			"log_rotation_type", "logging_context_format_string", "logging_default_format_string",
			"logging_debug_format_suffix", "logging_exception_prefix", "logging_user_identity_format",
			"publish_errors", "instance_format", "instance_uuid_format", "rate_limit_interval",
			"rate_limit_burst", "rate_limit_except_level", "fatal_deprecations",
			// oslo.messaging
			"control_exchange", "rpc_response_timeout", "executor_thread_pool_size",
			"rpc_conn_pool_size", "conn_pool_min_size", "conn_pool_ttl", "rpc_ping_enabled",
			// oslo.service
			"backdoor_port", "backdoor_socket", "log_options", "graceful_shutdown_timeout",
			"run_external_periodic_tasks",
		},
	},
	"keystone_authtoken": {
		whose: "keystonemiddleware's token validation; what the bridge validates tokens with is in its " +
			"[keystone]: token caches in memcached and service tokens have no equivalent",
	},
	"oslo_messaging_rabbit": {
		whose: "oslo.messaging's RabbitMQ driver; vgpu-bridge takes brokers, virtual host and TLS " +
			"(rabbit+ssl:// or ?ssl=1) from transport_url",
	},
	"oslo_messaging_notifications": {
		whose: "oslo.messaging's notifier",
		known: []string{"driver", "transport_url", "topics", "retry"},
	},
	"oslo_limit": {
		whose: "oslo.limit's Keystone session, with which Nova reads unified limits; the bridge reads them with a " +
			"password login, system-scoped, and TLS verified against cafile or the system's CAs",
	},
	"notifications": {
		whose: "Nova's own notifications",
		known: []string{"notify_on_state_change", "default_level", "notification_format",
			"versioned_notifications_topics", "bdms_in_notifications", "include_share_mapping"},
	},
}

// ignoredOslo reports whether [section] name, which names no option of
// the set, is an oslo option to read and ignore.
func (s *Set) ignoredOslo(section, name string) bool {
	sec, ok := osloSections[section]
	if !ok {
		return false
	}
	if !s.hasSection(section) {
		return true
	}
	for _, k := range sec.known {
		if k == name {
			return true
		}
	}
	return false
}

// ignoredWarnings are the warnings, one per section, that name the oslo
// options read from where and ignored.
func (s *Set) ignoredWarnings(ignored map[string][]string, where string) []string {
	secs := make([]string, 0, len(ignored))
	for sec := range ignored {
		secs = append(secs, sec)
	}
	sort.Slice(secs, func(i, j int) bool { return sectionLess(secs[i], secs[j]) })
	out := make([]string, 0, len(secs))
	for _, sec := range secs {
		names := ignored[sec]
		sort.Strings(names)
		out = append(out, fmt.Sprintf("%s: [%s] %s: ignored (%s)", where, sec, strings.Join(names, ", "), osloSections[sec].whose))
	}
	return out
}

// aliasValue is a value the file gave an option under an alias.
type aliasValue struct {
	alias   Alias
	raw     string
	targets []*Option
}

// applyAliases gives the options the values set in the file (where)
// under their aliases. An option set under two of its names to different
// values is an error naming both; to the same value, it is not.
func (s *Set) applyAliases(v *Values, vals []aliasValue, where string) Errors {
	var errs Errors
	setBy := map[string]string{} // option key → the alias that set it
	for _, av := range vals {
		for _, o := range av.targets {
			k := o.key()
			other := ""
			switch {
			case v.source[k] == where: // set under its own name
				other = "[" + o.Section + "] " + o.Name
			case setBy[k] != "":
				other = setBy[k]
			}
			if other == "" {
				v.raw[k] = av.raw
				v.source[k] = where + " as " + av.alias.String()
				setBy[k] = av.alias.String()
				continue
			}
			if sameValue(o, v.raw[k], av.raw) {
				continue
			}
			was := v.raw[k]
			if o.Secret {
				was = "***"
			}
			errs = append(errs, &Error{Section: av.alias.Section, Option: av.alias.Name, Value: av.raw, Secret: o.Secret,
				Problem: fmt.Sprintf("conflicts with %s = %q: both set [%s] %s; keep one", other, was, o.Section, o.Name)})
		}
	}
	return errs
}

// sameValue reports whether a and b are the same value of o ("True" and
// "true", "300" and "5m").
func sameValue(o *Option, a, b string) bool {
	x, errA := parseValue(o, a)
	y, errB := parseValue(o, b)
	if errA != nil || errB != nil {
		return a == b
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

// osloLines document, for the sample and the reference, the oslo sections
// a file may hold: the options read under oslo's names, and that the rest
// is ignored.
func (s *Set) osloLines() []string {
	secs := make([]string, 0, len(osloSections))
	for sec := range osloSections {
		secs = append(secs, sec)
	}
	sort.Slice(secs, func(i, j int) bool { return sectionLess(secs[i], secs[j]) })
	read := map[string][]string{}
	for _, o := range s.Options() {
		for _, a := range o.Aliases {
			read[a.Section] = append(read[a.Section], fmt.Sprintf("%s (as [%s] %s)", a.Name, o.Section, o.Name))
		}
	}
	var out []string
	for _, sec := range secs {
		o := osloSections[sec]
		line := fmt.Sprintf("[%s] (%s): ", sec, o.whose)
		rest := "every option is ignored, with a warning."
		if r := read[sec]; len(r) > 0 {
			sort.Strings(r)
			line += "read: " + strings.Join(r, ", ") + "; "
			rest = "the other options are ignored, with a warning."
		}
		if s.hasSection(sec) {
			var known []string
			for _, k := range o.known {
				if s.Lookup(sec, k) == nil && s.aliases[sec+"."+k] == nil {
					known = append(known, k)
				}
			}
			rest = "ignored with a warning: " + strings.Join(known, ", ") + "; any other name that is not the section's own option is an error."
		}
		out = append(out, line+rest)
	}
	return out
}

// LogFilePath is where a daemon named binary logs, given [DEFAULT]
// log_file and log_dir, as oslo.log decides it (_get_log_file_path in
// oslo_log/log.py): log_file, under log_dir when relative; log_dir alone
// means log_dir/binary.log; neither, "" (standard error).
func LogFilePath(binary, file, dir string) string {
	switch {
	case file != "" && dir != "" && !filepath.IsAbs(file):
		return filepath.Join(dir, file)
	case file != "":
		return file
	case dir != "":
		return filepath.Join(dir, binary+".log")
	}
	return ""
}
