package conf

// LogOptions are the [DEFAULT] logging options every daemon has, named and
// read as oslo.log's: debug, log_format, log_file, log_dir and
// default_log_levels.
type LogOptions struct {
	binary string
	debug  Bool
	format String
	file   String
	dir    String
	levels List
}

// LogOptions declares a daemon's logging options in g. binary names the
// daemon (the default file under log_dir, the examples); components lists
// its loggers' component names for the help of default_log_levels.
func (g *Group) LogOptions(binary, components string) LogOptions {
	return LogOptions{
		binary: binary,
		debug:  g.Bool(DefaultSection, "debug", false, "Log at debug level. Example: true"),
		format: g.Choice(DefaultSection, "log_format", "json", []string{"json", "text", "oslo_json"},
			"Format of the log lines written to standard error (journald keeps them): json (one JSON object a line, slog's keys), "+
				"text (key=value), or oslo_json: the records of oslo.log's JSONFormatter (use_json = true in an OpenStack "+
				"service), with its keys (message, asctime, name, levelname, context, extra…), for log pipelines that "+
				"parse OpenStack services' JSON logs, such as kolla-ansible's fluentd. Example: oslo_json"),
		file: g.String(DefaultSection, "log_file", "",
			"A file the daemon's log lines (serve) go to instead of standard error, as oslo.log's option: appended to, "+
				"and reopened when it was moved or removed (logrotate without copytruncate), as oslo.log's "+
				"watch_log_file. A relative path is under log_dir. Commands other than serve log to standard error. "+
				"Example: /var/log/kolla/"+binary+"/"+binary+".log"),
		dir: g.String(DefaultSection, "log_dir", "",
			"Directory of a relative log_file, as oslo.log's option; set alone, the daemon logs to "+
				"log_dir/"+binary+".log. Example: /var/log/kolla/"+binary),
		levels: g.List(DefaultSection, "default_log_levels", "",
			"Log levels of components, as oslo.log's option of the same name: COMPONENT=LEVEL pairs, LEVEL one of "+
				"DEBUG, INFO, WARN, ERROR, CRITICAL. A component's level replaces the process's (debug) for its logs, "+
				"more verbose or less. Components are the loggers' component attribute ("+components+"; "+
				"oslo_json's name shows it as "+binary+".COMPONENT, also accepted); other names are accepted and match nothing, "+
				"so nova.conf's list may be copied. Example: dispatch=DEBUG,placement=WARN"),
	}
}

// Debug reports whether [DEFAULT] debug is set.
func (o LogOptions) Debug(v *Values) bool { return o.debug.Get(v) }

// Format returns [DEFAULT] log_format.
func (o LogOptions) Format(v *Values) string { return o.format.Get(v) }

// File returns where the daemon logs, from [DEFAULT] log_file and log_dir
// (LogFilePath); "" for standard error.
func (o LogOptions) File(v *Values) string { return LogFilePath(o.binary, o.file.Get(v), o.dir.Get(v)) }

// Levels returns [DEFAULT] default_log_levels.
func (o LogOptions) Levels(v *Values) []string { return o.levels.Get(v) }
