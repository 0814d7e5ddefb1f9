package daemon

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// TestLogLevelsPerComponent: default_log_levels sets the level of each
// component's logger, above or below the process's (debug), for every
// log format; loggers of other components keep the process's level.
func TestLogLevelsPerComponent(t *testing.T) {
	for _, format := range []string{"json", "text", "oslo_json"} {
		t.Run(format, func(t *testing.T) {
			var out bytes.Buffer
			g := &Globals{Spec: testSpec(), Stderr: &out}
			g.Overrides = []string{"DEFAULT.log_format=" + format,
				// nova.conf's list: Python packages match nothing.
				"DEFAULT.default_log_levels=amqp=WARN,dispatch=DEBUG,testd.placement=ERROR,oslo.messaging=INFO"}
			v, err := g.Load()
			if err != nil {
				t.Fatal(err)
			}
			log := g.Logger(v)
			for _, c := range []string{"dispatch", "placement", "api"} {
				l := log.With("component", c)
				l.Debug("debug-" + c)
				l.Info("info-" + c)
				l.Warn("warn-" + c)
				l.Error("error-" + c)
			}
			// A group's "component" is not the logger's.
			log.WithGroup("peer").With("component", "dispatch").Debug("debug-grouped")
			want := map[string]bool{
				"debug-dispatch": true, "info-dispatch": true, "warn-dispatch": true, "error-dispatch": true,
				"debug-placement": false, "info-placement": false, "warn-placement": false, "error-placement": true,
				"debug-api": false, "info-api": true, "warn-api": true, "error-api": true,
				"debug-grouped": false,
			}
			for msg, shown := range want {
				if got := strings.Contains(out.String(), msg); got != shown {
					t.Errorf("%s shown %v, want %v", msg, got, shown)
				}
			}
			if format == "oslo_json" {
				line, _, _ := strings.Cut(out.String(), "\n")
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["name"] != "testd.dispatch" || rec["levelname"] != "DEBUG" {
					t.Errorf("first record %v (%v), want testd.dispatch at DEBUG", rec, err)
				}
			}
		})
	}
}

// TestLogLevelsRefused: a pair that is not COMPONENT=LEVEL, or a level
// oslo.log does not name, is a configuration error (config check sees
// it), naming the pair.
func TestLogLevelsRefused(t *testing.T) {
	for _, tc := range []struct{ list, want string }{
		{"dispatch=LOUD", `"dispatch=LOUD": level "LOUD"`},
		{"dispatch", `"dispatch": want COMPONENT=LEVEL`},
		{"=DEBUG", `"=DEBUG": want COMPONENT=LEVEL`},
	} {
		var out, errb bytes.Buffer
		rc := Main(testSpec(), []string{"config", "check", "--config", "", "--set", "DEFAULT.default_log_levels=" + tc.list}, &out, &errb)
		if rc != ExitUsage || !strings.Contains(errb.String(), "[DEFAULT] default_log_levels") || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%s: exit %d, %q", tc.list, rc, errb.String())
		}
	}
	levels, err := ParseLogLevels("testd", []string{"a=warning", "testd.b=critical", "c=Fatal", "d=trace"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]slog.Level{"a": slog.LevelWarn, "b": slog.LevelError + 4, "c": slog.LevelError + 4, "d": slog.LevelDebug}
	for k, l := range want {
		if levels[k] != l {
			t.Errorf("%s = %v, want %v", k, levels[k], l)
		}
	}
}
