package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// osloRecord is one log line as oslo.log's JSONFormatter writes it
// (oslo_log/formatters.py, JSONFormatter.format and its JSONLogRecord):
// the same keys in the same order, so that what parses an OpenStack
// service's JSON logs (kolla-ansible's fluentd, its Elasticsearch or
// OpenSearch mappings) parses ours. Python's logging fields without a Go
// equivalent keep their type with an empty value: args is the empty tuple
// of a message without %-arguments, thread and thread_name are null (a
// goroutine has no name or stable id to show), traceback is null (a Go
// error carries none).
type osloRecord struct {
	Message         string         `json:"message"`
	Asctime         string         `json:"asctime"`
	Name            string         `json:"name"`
	Msg             string         `json:"msg"`
	Args            []any          `json:"args"`
	Levelname       string         `json:"levelname"`
	Levelno         int            `json:"levelno"`
	Pathname        string         `json:"pathname"`
	Filename        string         `json:"filename"`
	Module          string         `json:"module"`
	Lineno          int            `json:"lineno"`
	Funcname        string         `json:"funcname"`
	Created         float64        `json:"created"`
	Msecs           float64        `json:"msecs"`
	RelativeCreated float64        `json:"relative_created"`
	Thread          *int           `json:"thread"`
	ThreadName      *string        `json:"thread_name"`
	ProcessName     string         `json:"process_name"`
	Process         int            `json:"process"`
	Traceback       *string        `json:"traceback"`
	Hostname        *string        `json:"hostname"`
	ErrorSummary    string         `json:"error_summary"`
	Context         map[string]any `json:"context"`
	Extra           map[string]any `json:"extra"`
}

// contextKeys are the attributes that go to the record's context, under
// oslo.context's names (RequestContext.to_dict), rather than to extra.
var contextKeys = map[string]string{
	logkey.RequestID:       "request_id",
	logkey.GlobalRequestID: "global_request_id",
	logkey.User:            "user",
	logkey.Project:         "project",
}

// osloJSONHandler writes records as oslo.log's JSONFormatter does, one
// JSON object a line.
type osloJSONHandler struct {
	out   *osloOut
	level slog.Leveler
	// name is the daemon's; a logger with a component attribute is
	// "name.component", as Python's logger names are dotted packages.
	name, component string
	attrs           []groupedAttr
	groups          []string
}

// osloOut is what the handlers of one logger share.
type osloOut struct {
	mu       sync.Mutex
	w        io.Writer
	hostname *string
	pid      int
	start    time.Time // relative_created counts from it, as Python's from logging's import
}

type groupedAttr struct {
	groups []string
	attr   slog.Attr
}

func newOsloJSONHandler(w io.Writer, name string, level slog.Leveler) *osloJSONHandler {
	out := &osloOut{w: w, pid: os.Getpid(), start: time.Now()}
	if h, err := os.Hostname(); err == nil {
		out.hostname = &h
	}
	return &osloJSONHandler{out: out, level: level, name: name}
}

func (h *osloJSONHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

func (h *osloJSONHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append([]groupedAttr(nil), h.attrs...)
	for _, a := range as {
		if len(h.groups) == 0 && a.Key == "component" {
			c.component = a.Value.String()
		}
		c.attrs = append(c.attrs, groupedAttr{h.groups, a})
	}
	return &c
}

func (h *osloJSONHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.groups = append(append([]string(nil), h.groups...), name)
	return &c
}

// osloLevel is the Python logging level of l: its name and number.
func osloLevel(l slog.Level) (string, int) {
	switch {
	case l < slog.LevelInfo:
		return "DEBUG", 10
	case l < slog.LevelWarn:
		return "INFO", 20
	case l < slog.LevelError:
		return "WARNING", 30
	case l < slog.LevelError+4:
		return "ERROR", 40
	}
	return "CRITICAL", 50
}

func (h *osloJSONHandler) Handle(_ context.Context, r slog.Record) error {
	rec := h.record(r)
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("oslo json log record: %w", err)
	}
	b = append(b, '\n')
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	_, err = h.out.w.Write(b)
	return err
}

func (h *osloJSONHandler) record(r slog.Record) osloRecord {
	levelname, levelno := osloLevel(r.Level)
	name := h.name
	if h.component != "" {
		name += "." + h.component
	}
	ns := r.Time.UnixNano()
	rec := osloRecord{
		Message: r.Message,
		// logging.Formatter.formatTime without datefmt: local time,
		// "%Y-%m-%d %H:%M:%S" and ",%03d" milliseconds.
		Asctime:         r.Time.Format("2006-01-02 15:04:05") + fmt.Sprintf(",%03d", r.Time.Nanosecond()/1e6),
		Name:            name,
		Msg:             r.Message,
		Args:            []any{},
		Levelname:       levelname,
		Levelno:         levelno,
		Pathname:        "(unknown file)",
		Filename:        "(unknown file)",
		Module:          "Unknown module",
		Funcname:        "(unknown function)",
		Created:         float64(ns) / 1e9,
		Msecs:           float64(r.Time.Nanosecond() / 1e6),
		RelativeCreated: float64(r.Time.Sub(h.out.start).Microseconds()) / 1e3,
		ProcessName:     h.name,
		Process:         h.out.pid,
		Hostname:        h.out.hostname,
		Context:         map[string]any{},
		Extra:           map[string]any{},
	}
	if r.PC != 0 {
		f, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
		rec.Pathname, rec.Lineno = f.File, f.Line
		rec.Filename = filepath.Base(f.File)
		rec.Module = strings.TrimSuffix(rec.Filename, filepath.Ext(rec.Filename))
		fn := f.Function[strings.LastIndex(f.Function, "/")+1:] // pkg.(*T).Method
		_, rec.Funcname, _ = strings.Cut(fn, ".")
	}
	add := func(ga groupedAttr) {
		a := ga.attr
		a.Value = a.Value.Resolve()
		if a.Equal(slog.Attr{}) {
			return
		}
		if len(ga.groups) == 0 {
			if k, ok := contextKeys[a.Key]; ok {
				rec.Context[k] = osloValue(a.Value)
				return
			}
			if a.Key == logkey.Err && r.Level >= slog.LevelWarn {
				// _get_error_summary: the exception's one-line
				// summary, for warnings and errors only.
				rec.ErrorSummary = strings.SplitN(fmt.Sprint(osloValue(a.Value)), "\n", 2)[0]
			}
		}
		m := rec.Extra
		for _, g := range ga.groups {
			sub, ok := m[g].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[g] = sub
			}
			m = sub
		}
		if a.Key == "" && a.Value.Kind() == slog.KindGroup { // an inline group
			for _, ga2 := range a.Value.Group() {
				m[ga2.Key] = osloValue(ga2.Value.Resolve())
			}
			return
		}
		m[a.Key] = osloValue(a.Value)
	}
	for _, ga := range h.attrs {
		add(ga)
	}
	r.Attrs(func(a slog.Attr) bool {
		add(groupedAttr{h.groups, a})
		return true
	})
	return rec
}

// osloValue is v as JSON shows it. As oslo's _json_dumps_with_fallback
// falls back to repr(), what JSON cannot show is shown as text.
func osloValue(v slog.Value) any {
	switch v.Kind() {
	case slog.KindString:
		return v.String()
	case slog.KindInt64:
		return v.Int64()
	case slog.KindUint64:
		return v.Uint64()
	case slog.KindFloat64:
		return v.Float64()
	case slog.KindBool:
		return v.Bool()
	case slog.KindDuration:
		return v.Duration().String()
	case slog.KindTime:
		return v.Time().Format(time.RFC3339Nano)
	case slog.KindGroup:
		m := map[string]any{}
		for _, a := range v.Group() {
			m[a.Key] = osloValue(a.Value.Resolve())
		}
		return m
	}
	switch x := v.Any().(type) {
	case error:
		return x.Error()
	case fmt.Stringer:
		return x.String()
	case json.Marshaler:
		return x
	default:
		if _, err := json.Marshal(x); err != nil {
			return fmt.Sprintf("%+v", x)
		}
		return x
	}
}
