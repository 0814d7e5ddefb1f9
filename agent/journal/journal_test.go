package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func cmd(id string, exp time.Time) protocol.Command {
	return protocol.Command{V: 1, ID: id, Kind: protocol.AttachVGPU, Host: "h", ExpiresAt: exp}
}

func open(t *testing.T, path string, c *clock) *Journal {
	t.Helper()
	j, err := Open(path, Options{Now: c.now, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestReplayAfterReopen(t *testing.T) {
	c := &clock{time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "state", "journal")
	j := open(t, path, c)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(j.Begin(cmd("a", c.t.Add(time.Minute))))
	must(j.StepDone("a", "mdev_created", ""))
	must(j.Own(Device{Kind: KindMdev, UUID: "4B20D080-1B54-4048-85B3-A6A62D165C01", Parent: "0000:3b:00.0", Type: "nvidia-232", CommandID: "a"}))
	must(j.Begin(cmd("b", c.t.Add(time.Minute))))
	if _, err := j.Finish("b", protocol.Result{V: 1, CommandID: "b", Status: protocol.Succeeded}); err != nil {
		t.Fatal(err)
	}
	must(j.Own(Device{Kind: KindVF, Parent: "0000:41:00.4", Type: "1428"}))
	must(j.Own(Device{Kind: KindVF, Parent: "0000:41:00.5", Type: "1428"}))
	must(j.Release(VFKey("0000:41:00.5")))
	if err := j.StepDone("zzz", "x", ""); !errors.Is(err, ErrUnknownCommand) {
		t.Errorf("step of unknown command: %v", err)
	}
	must(j.Close())
	// A crash in the middle of a write leaves a torn last line.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`1234abcd {"op":"end","id":"a","res`)
	f.Close()

	j = open(t, path, c)
	defer j.Close()
	p := j.Pending()
	if len(p) != 1 || p[0].Command.ID != "a" {
		t.Fatalf("pending = %+v", p)
	}
	if _, ok := p[0].Done("mdev_created"); !ok {
		t.Error("step mdev_created lost")
	}
	if e, ok := j.Lookup("b"); !ok || e.Result == nil || e.Result.Status != protocol.Succeeded || e.Result.FinishedAt.IsZero() {
		t.Errorf("b = %+v", e)
	}
	devs := j.Devices()
	if len(devs) != 2 || devs[0].Key() != "mdev:4b20d080-1b54-4048-85b3-a6a62d165c01" || devs[1].Key() != "vf:0000:41:00.4" {
		t.Errorf("devices = %+v", devs)
	}
	if _, ok := j.Owned(MdevKey("4b20d080-1b54-4048-85b3-a6a62d165c01")); !ok {
		t.Error("Owned by lower-case key")
	}
	if err := j.Begin(cmd("b", c.t)); err == nil {
		t.Error("Begin of a finished command succeeded")
	}
	// Begin of a pending command keeps its steps.
	must(j.Begin(cmd("a", c.t)))
	if e, _ := j.Lookup("a"); len(e.Steps) != 1 {
		t.Errorf("steps after re-Begin = %+v", e.Steps)
	}
}

func TestCorruptMiddle(t *testing.T) {
	c := &clock{time.Now()}
	path := filepath.Join(t.TempDir(), "journal")
	j := open(t, path, c)
	j.Begin(cmd("a", c.t.Add(time.Hour)))
	j.StepDone("a", "s1", "")
	j.StepDone("a", "s2", "")
	j.Close()
	b, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(b), "\n")
	lines[1] = strings.Replace(lines[1], "s1", "s9", 1)
	os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600)
	if _, err := Open(path, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open = %v, want ErrCorrupt", err)
	}
}

func TestCompactionRetention(t *testing.T) {
	c := &clock{time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, Options{Now: c.now, Retention: time.Hour, CompactAfter: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, id := range []string{"old", "new"} {
		j.Begin(cmd(id, c.t.Add(time.Minute)))
		j.Finish(id, protocol.Result{V: 1, CommandID: id, Status: protocol.Succeeded})
		c.t = c.t.Add(90 * time.Minute)
	}
	// "old" finished 3h ago and expired long ago; "new" 90 min ago.
	c.t = c.t.Add(-30 * time.Minute)
	if err := j.Compact(); err != nil {
		t.Fatal(err)
	}
	if _, ok := j.Lookup("old"); ok {
		t.Error("old result kept past retention")
	}
	if _, ok := j.Lookup("new"); !ok {
		t.Error("new result dropped within retention")
	}
	j.Close() // as the agent that restarts
	j2, err := Open(path, Options{Now: c.now, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	if _, ok := j2.Lookup("new"); !ok {
		t.Error("compacted file lost new")
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Error("temporary file left behind")
	}
}

func BenchmarkStepDone(b *testing.B) {
	j, err := Open(filepath.Join(b.TempDir(), "journal"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	j.Begin(cmd("a", time.Now().Add(time.Hour)))
	for b.Loop() {
		j.StepDone("a", "s", "")
	}
}

// TestOneProcessPerJournal: a second open of the same journal (another
// agent given the same state_path) fails naming the holder, until the
// first closes it.
func TestOneProcessPerJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(path, Options{})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second open: %v, want ErrLocked naming pid %d", err, os.Getpid())
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j2, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	j2.Close()
}
