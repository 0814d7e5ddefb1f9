// Package journal is the agent's local, crash-safe memory: the commands it
// has begun and finished (with the steps of each and its result) and the
// devices it owns (the mdevs and vendor-VFIO VF types it created and that
// should exist).
//
// The journal is an append-only file of checksummed JSON lines, each
// written and fsynced before the step it records is considered done, so
// after a crash (kill -9, power loss) the agent knows which commands were in
// the middle and which of their steps had completed. A torn last line is
// dropped at Open; a bad line followed by good ones is corruption and Open
// refuses it. At Open, and when the file has grown, the journal is
// compacted: the live state is written to a new file that atomically
// replaces the old one.
//
// Only the devices listed here may be removed or recreated by the agent;
// every other mdev on the host (Nova's) is reported, never touched.
package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// ErrCorrupt is returned by Open for a journal with a bad record that is
// not the last one.
var ErrCorrupt = errors.New("journal is corrupt")

// ErrUnknownCommand is returned when a step or result names a command that
// was never begun.
var ErrUnknownCommand = errors.New("command not in journal")

// Device kinds.
const (
	KindMdev = "mdev" // a mediated device: UUID, Parent (GPU), Type
	KindVF   = "vf"   // a vendor-VFIO VF: Parent (the VF), Type (numeric)
)

// Device is a device the agent created and that should exist.
type Device struct {
	Kind   string `json:"kind"`
	UUID   string `json:"uuid,omitempty"`
	Parent string `json:"parent"` // PCI address, sysfs form
	Type   string `json:"type"`
	// CommandID is the command that created it.
	CommandID string    `json:"command_id,omitempty"`
	Since     time.Time `json:"since"`
}

// Key identifies a device: "mdev:<uuid>" or "vf:<pci>".
func (d Device) Key() string {
	if d.Kind == KindVF {
		return VFKey(d.Parent)
	}
	return MdevKey(d.UUID)
}

// MdevKey is the key of the mdev uuid.
func MdevKey(uuid string) string { return KindMdev + ":" + strings.ToLower(uuid) }

// VFKey is the key of the VF at addr (sysfs form).
func VFKey(addr string) string { return KindVF + ":" + addr }

// Step is a completed step of a command.
type Step struct {
	Name string `json:"name"`
	// Data is what later steps or a rollback need to know (e.g. whether
	// the domain was running before a cold attach).
	Data string    `json:"data,omitempty"`
	At   time.Time `json:"at"`
}

// Entry is a command as the journal knows it.
type Entry struct {
	Command protocol.Command `json:"command"`
	Begun   time.Time        `json:"begun"`
	Steps   []Step           `json:"steps,omitempty"`
	Result  *protocol.Result `json:"result,omitempty"`
}

// Done reports whether the step name completed.
func (e *Entry) Done(name string) (Step, bool) {
	for _, s := range e.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return Step{}, false
}

// Finished reports whether the command has a result.
func (e *Entry) Finished() bool { return e.Result != nil }

// Record operations.
const (
	opBegin   = "begin"
	opStep    = "step"
	opEnd     = "end"
	opOwn     = "own"
	opRelease = "release"
)

// record is one line of the file.
type record struct {
	Op      string            `json:"op"`
	At      time.Time         `json:"at"`
	ID      string            `json:"id,omitempty"`
	Command *protocol.Command `json:"command,omitempty"`
	Begun   *time.Time        `json:"begun,omitempty"`
	Step    *Step             `json:"step,omitempty"`
	Result  *protocol.Result  `json:"result,omitempty"`
	Device  *Device           `json:"device,omitempty"`
	Key     string            `json:"key,omitempty"`
}

// Options tune a journal; the zero value is usable.
type Options struct {
	// Retention is how long a finished command's result is kept (past both
	// its finish and its expires_at) to answer duplicate deliveries.
	// Default 24h.
	Retention time.Duration
	// CompactAfter is the number of appended records after which the file
	// is compacted. Default 4096.
	CompactAfter int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Journal is an open journal file. It is safe for concurrent use.
type Journal struct {
	mu       sync.Mutex
	path     string
	f        *os.File
	opts     Options
	cmds     map[string]*Entry
	devs     map[string]Device
	appended int
	closed   bool
	lock     *os.File // path.lock, flock'ed while open
}

// ErrLocked says another process has the journal open: two agents must
// not share one state_path.
var ErrLocked = errors.New("journal: in use by another process")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Open opens or creates the journal at path (its directory is created
// with mode 0700), replays it and compacts it.
func Open(path string, opts Options) (*Journal, error) {
	if opts.Retention <= 0 {
		opts.Retention = defaults().Retention
	}
	if opts.CompactAfter <= 0 {
		opts.CompactAfter = 4096
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	lock, err := lockFile(path + ".lock")
	if err != nil {
		return nil, err
	}
	j := &Journal{path: path, opts: opts, cmds: map[string]*Entry{}, devs: map[string]Device{}, lock: lock}
	if err := j.replay(); err != nil {
		lock.Close()
		return nil, err
	}
	if err := j.compactLocked(); err != nil {
		lock.Close()
		return nil, err
	}
	return j, nil
}

// lockFile takes an exclusive flock on path (created 0600), holding the
// process id in it for the message of the next one that tries. The lock
// goes with the process, whatever way it ends.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (pid %s); give each agent its own state_path", ErrLocked, path, bytes.TrimSpace(holder))
		}
		return nil, fmt.Errorf("journal: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return f, nil
}

// Path is the journal file's path.
func (j *Journal) Path() string { return j.path }

func (j *Journal) replay() error {
	f, err := os.Open(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	line := 0
	for {
		b, err := r.ReadBytes('\n')
		if len(b) == 0 && errors.Is(err, io.EOF) {
			return nil
		}
		line++
		rec, perr := parseLine(b)
		if perr != nil || err != nil {
			// A bad or unterminated line is a torn write only when nothing
			// valid follows it.
			rest, _ := io.ReadAll(r)
			if len(bytes.TrimSpace(rest)) > 0 {
				return fmt.Errorf("%w: %s line %d: %v", ErrCorrupt, j.path, line, perr)
			}
			return nil // dropped; compaction rewrites the file without it
		}
		j.apply(rec)
	}
}

func parseLine(b []byte) (record, error) {
	var rec record
	b = bytes.TrimRight(b, "\n")
	sum, body, ok := bytes.Cut(b, []byte(" "))
	if !ok || len(sum) != 8 {
		return rec, errors.New("no checksum")
	}
	if fmt.Sprintf("%08x", crc32.Checksum(body, crcTable)) != string(sum) {
		return rec, errors.New("checksum mismatch")
	}
	if err := json.Unmarshal(body, &rec); err != nil {
		return rec, err
	}
	return rec, nil
}

func encodeLine(rec record) ([]byte, error) {
	body, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body)+10)
	out = fmt.Appendf(out, "%08x ", crc32.Checksum(body, crcTable))
	out = append(out, body...)
	return append(out, '\n'), nil
}

// apply changes the in-memory state by one record.
func (j *Journal) apply(rec record) {
	switch rec.Op {
	case opBegin:
		if rec.Command == nil {
			return
		}
		e := &Entry{Command: *rec.Command, Begun: rec.At}
		if rec.Begun != nil {
			e.Begun = *rec.Begun
		}
		if old, ok := j.cmds[rec.Command.ID]; ok && old.Finished() {
			return
		}
		j.cmds[rec.Command.ID] = e
	case opStep:
		if e, ok := j.cmds[rec.ID]; ok && rec.Step != nil {
			e.Steps = append(e.Steps, *rec.Step)
		}
	case opEnd:
		if e, ok := j.cmds[rec.ID]; ok && rec.Result != nil {
			r := *rec.Result
			e.Result = &r
		}
	case opOwn:
		if rec.Device != nil {
			j.devs[rec.Device.Key()] = *rec.Device
		}
	case opRelease:
		delete(j.devs, rec.Key)
	}
}

// append writes rec durably, then applies it.
func (j *Journal) append(rec record) error {
	if j.closed {
		return errors.New("journal is closed")
	}
	if rec.At.IsZero() {
		rec.At = j.opts.Now().UTC()
	}
	line, err := encodeLine(rec)
	if err != nil {
		return fmt.Errorf("journal: encode: %w", err)
	}
	if _, err := j.f.Write(line); err != nil {
		return fmt.Errorf("journal: write: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("journal: sync: %w", err)
	}
	j.apply(rec)
	j.appended++
	if j.appended >= j.opts.CompactAfter {
		return j.compactLocked()
	}
	return nil
}

// compactLocked writes the live state to path.tmp, fsyncs it, renames it
// over path and fsyncs the directory.
func (j *Journal) compactLocked() error {
	now := j.opts.Now()
	var buf bytes.Buffer
	ids := make([]string, 0, len(j.cmds))
	for id, e := range j.cmds {
		if e.Finished() && now.Sub(e.Result.FinishedAt) > j.opts.Retention && now.Sub(e.Command.ExpiresAt) > j.opts.Retention {
			delete(j.cmds, id)
			continue
		}
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		if c := j.cmds[a].Begun.Compare(j.cmds[b].Begun); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	write := func(rec record) error {
		line, err := encodeLine(rec)
		if err != nil {
			return err
		}
		buf.Write(line)
		return nil
	}
	for _, id := range ids {
		e := j.cmds[id]
		c, begun := e.Command, e.Begun
		if err := write(record{Op: opBegin, At: e.Begun, Command: &c, Begun: &begun}); err != nil {
			return err
		}
		for _, s := range e.Steps {
			if err := write(record{Op: opStep, At: s.At, ID: id, Step: &s}); err != nil {
				return err
			}
		}
		if e.Result != nil {
			if err := write(record{Op: opEnd, At: e.Result.FinishedAt, ID: id, Result: e.Result}); err != nil {
				return err
			}
		}
	}
	for _, k := range slices.Sorted(mapsKeys(j.devs)) {
		d := j.devs[k]
		if err := write(record{Op: opOwn, At: d.Since, Device: &d}); err != nil {
			return err
		}
	}
	tmp := j.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		f.Close()
		return fmt.Errorf("journal: compact: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("journal: compact: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	if err := syncDir(filepath.Dir(j.path)); err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	if j.f != nil {
		j.f.Close()
	}
	j.f, err = os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.appended = 0
	return nil
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Close closes the file.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closed = true
	err := j.f.Close()
	if j.lock != nil {
		j.lock.Close() // releases the flock
	}
	return err
}

// Compact rewrites the file with the live state now.
func (j *Journal) Compact() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.compactLocked()
}

func copyEntry(e *Entry) Entry {
	out := *e
	out.Steps = slices.Clone(e.Steps)
	if e.Result != nil {
		r := *e.Result
		out.Result = &r
	}
	return out
}

// Lookup returns the journal's entry for a command id.
func (j *Journal) Lookup(id string) (Entry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.cmds[id]
	if !ok {
		return Entry{}, false
	}
	return copyEntry(e), true
}

// Begin records that the command starts. Beginning a command already begun
// and not finished is a no-op (a resumed command keeps its steps); one
// already finished is an error.
func (j *Journal) Begin(c protocol.Command) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if e, ok := j.cmds[c.ID]; ok {
		if e.Finished() {
			return fmt.Errorf("journal: command %s already finished", c.ID)
		}
		return nil
	}
	now := j.opts.Now().UTC()
	return j.append(record{Op: opBegin, At: now, Command: &c, Begun: &now})
}

// StepDone records that step name of command id completed.
func (j *Journal) StepDone(id, name, data string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.cmds[id]; !ok {
		return fmt.Errorf("%w: %s", ErrUnknownCommand, id)
	}
	return j.append(record{Op: opStep, ID: id, Step: &Step{Name: name, Data: data, At: j.opts.Now().UTC()}})
}

// Finish records the command's result; FinishedAt is set when zero.
func (j *Journal) Finish(id string, r protocol.Result) (protocol.Result, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.cmds[id]; !ok {
		return r, fmt.Errorf("%w: %s", ErrUnknownCommand, id)
	}
	if r.FinishedAt.IsZero() {
		r.FinishedAt = j.opts.Now().UTC().Truncate(time.Millisecond)
	}
	return r, j.append(record{Op: opEnd, ID: id, Result: &r})
}

// Pending returns the commands begun and not finished, oldest first.
func (j *Journal) Pending() []Entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []Entry
	for _, e := range j.cmds {
		if !e.Finished() {
			out = append(out, copyEntry(e))
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.Begun.Compare(b.Begun) })
	return out
}

// Own records that the agent owns d and that d should exist.
func (j *Journal) Own(d Device) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if d.Kind == KindMdev {
		d.UUID = strings.ToLower(d.UUID)
	}
	if d.Since.IsZero() {
		d.Since = j.opts.Now().UTC()
	}
	if old, ok := j.devs[d.Key()]; ok && old.Kind == d.Kind && old.UUID == d.UUID && old.Parent == d.Parent && old.Type == d.Type {
		return nil
	}
	return j.append(record{Op: opOwn, Device: &d})
}

// Release records that the device with key no longer should exist and is
// no longer the agent's. Releasing an unknown key is a no-op.
func (j *Journal) Release(key string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.devs[key]; !ok {
		return nil
	}
	return j.append(record{Op: opRelease, Key: key})
}

// Owned returns the owned device with key.
func (j *Journal) Owned(key string) (Device, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	d, ok := j.devs[key]
	return d, ok
}

// Devices returns the owned devices, sorted by key.
func (j *Journal) Devices() []Device {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]Device, 0, len(j.devs))
	for _, k := range slices.Sorted(mapsKeys(j.devs)) {
		out = append(out, j.devs[k])
	}
	return out
}
