package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestOsloJSONGolden: one record as oslo.log's JSONFormatter writes it,
// key for key (testdata/oslo_json.golden): the logger's component in the
// dotted name, request ids in context, the other attributes in extra, the
// error's summary for a warning.
func TestOsloJSONGolden(t *testing.T) {
	var buf bytes.Buffer
	h := newOsloJSONHandler(&buf, "vgpu-bridge", slog.LevelDebug)
	host := "bridge-1.example.org"
	h.out.hostname, h.out.pid = &host, 4242
	at := time.Date(2026, 12, 6, 13, 5, 9, 123456789, time.UTC)
	h.out.start = at.Add(-1500 * time.Millisecond)
	log := slog.New(h).With("component", "dispatch", "replica", "bridge-1")
	r := slog.NewRecord(at, slog.LevelWarn, "command not confirmed", callerPC())
	r.AddAttrs(slog.String(logkey.RequestID, "req-8c1e2e58-5b5e-4cde-9d3f-0d6e3d1a6f10"),
		slog.String(logkey.GlobalRequestID, "req-3b0b4c1d-8d59-4c6e-a3a8-0f2b4a8d9e11"),
		slog.String(logkey.Command, "7f7e2a4c-1f55-4b8e-9a0a-6d2f3c4b5a69"),
		slog.Duration(logkey.Duration, 1500*time.Millisecond),
		slog.Any(logkey.Err, errors.New("publish confirm timed out\nafter 10s")),
		slog.Group("broker", slog.String("host", "rabbit1:5671"), slog.Int("attempt", 3)))
	if err := log.Handler().Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	got := strings.ReplaceAll(buf.String(), wd, "$PWD")
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, []byte(got), "", "  "); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, got)
	}
	golden := filepath.Join("testdata", "oslo_json.golden")
	if *update {
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if pretty.String() != string(want) {
		t.Errorf("record differs from %s (go test -run TestOsloJSONGolden -update rewrites it):\n%s", golden, pretty.String())
	}
	if strings.Count(buf.String(), "\n") != 1 {
		t.Errorf("not one line: %q", buf.String())
	}
}

// TestOsloJSONKeys: every key of oslo.log's JSONLogRecord, in its order,
// whatever the record holds.
func TestOsloJSONKeys(t *testing.T) {
	var buf bytes.Buffer
	slog.New(newOsloJSONHandler(&buf, "vgpu-agent", slog.LevelInfo)).Info("started")
	want := []string{"message", "asctime", "name", "msg", "args", "levelname", "levelno", "pathname", "filename",
		"module", "lineno", "funcname", "created", "msecs", "relative_created", "thread", "thread_name",
		"process_name", "process", "traceback", "hostname", "error_summary", "context", "extra"}
	dec := json.NewDecoder(&buf)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %v %v", tok, err)
	}
	var keys []string
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(keys, " ") != strings.Join(want, " ") {
		t.Errorf("keys\n%v\nwant\n%v", keys, want)
	}
}
