package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// ParseLogLevels reads [DEFAULT] default_log_levels, oslo.log's list of
// "logger=LEVEL" pairs: here a logger is a component (the "component"
// attribute of the loggers the daemon hands its parts: dispatch,
// notifications, placement…), also written "vgpu-bridge.dispatch" as the
// oslo_json log format names it. Levels are oslo's (Python's) names:
// DEBUG, INFO, WARN or WARNING, ERROR, CRITICAL or FATAL. Names that
// match no component are kept: nova.conf's list names Python packages.
func ParseLogLevels(daemon string, pairs []string) (map[string]slog.Level, error) {
	levels := make(map[string]slog.Level, len(pairs))
	for _, p := range pairs {
		name, lv, ok := strings.Cut(p, "=")
		name, lv = strings.TrimSpace(name), strings.TrimSpace(lv)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want COMPONENT=LEVEL, e.g. dispatch=DEBUG", p)
		}
		var l slog.Level
		switch strings.ToUpper(lv) {
		case "DEBUG", "TRACE":
			l = slog.LevelDebug
		case "INFO":
			l = slog.LevelInfo
		case "WARN", "WARNING":
			l = slog.LevelWarn
		case "ERROR":
			l = slog.LevelError
		case "CRITICAL", "FATAL":
			l = slog.LevelError + 4
		default:
			return nil, fmt.Errorf("%q: level %q is not DEBUG, INFO, WARN, WARNING, ERROR or CRITICAL", p, lv)
		}
		levels[strings.TrimPrefix(name, daemon+".")] = l
	}
	return levels, nil
}

// levelHandler filters records by the level of their logger's component
// (ParseLogLevels), or the process's level for a logger without one. The
// component is known when the logger is made (Logger.With("component",
// …)), so the filter costs one comparison per record, as slog's own.
type levelHandler struct {
	inner  slog.Handler
	levels map[string]slog.Level
	level  slog.Level
	// grouped: attributes added now are in a group, not the logger's
	// component.
	grouped bool
}

// withLogLevels returns inner filtered at base, or for a component
// listed in levels at its level. inner must let every level through that
// base or levels allow.
func withLogLevels(inner slog.Handler, base slog.Level, levels map[string]slog.Level) slog.Handler {
	if len(levels) == 0 {
		return inner
	}
	return &levelHandler{inner: inner, levels: levels, level: base}
}

// lowestLevel is the lowest of base and levels: the level the handler
// under a levelHandler must let through.
func lowestLevel(base slog.Level, levels map[string]slog.Level) slog.Level {
	for _, l := range levels {
		base = min(base, l)
	}
	return base
}

func (h *levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.inner.Enabled(ctx, l)
}

func (h *levelHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.level {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

func (h *levelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := &levelHandler{inner: h.inner.WithAttrs(as), levels: h.levels, level: h.level, grouped: h.grouped}
	for _, a := range as {
		if h.grouped || a.Key != "component" {
			continue
		}
		if l, ok := h.levels[a.Value.String()]; ok {
			c.level = l
		}
	}
	return c
}

func (h *levelHandler) WithGroup(name string) slog.Handler {
	return &levelHandler{inner: h.inner.WithGroup(name), levels: h.levels, level: h.level, grouped: h.grouped || name != ""}
}
