package policy

import (
	"sync"
	"time"
)

// Tracker is an in-memory LoadState: it remembers when load rules'
// conditions started to hold and when instances last changed. It is safe
// for concurrent use. Apply a decision's LoadUpdates once the bridge acts
// on it.
type Tracker struct {
	mu     sync.RWMutex
	since  map[[2]string]time.Time
	change map[string]time.Time
}

var _ LoadState = (*Tracker)(nil)

// NewTracker returns an empty tracker.
func NewTracker() *Tracker {
	return &Tracker{since: map[[2]string]time.Time{}, change: map[string]time.Time{}}
}

// Since implements LoadState.
func (t *Tracker) Since(instance, rule string) (time.Time, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s, ok := t.since[[2]string{instance, rule}]
	return s, ok
}

// LastChange implements LoadState.
func (t *Tracker) LastChange(instance string) (time.Time, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s, ok := t.change[instance]
	return s, ok
}

// Apply records a decision's load updates.
func (t *Tracker) Apply(updates []LoadUpdate) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, u := range updates {
		k := [2]string{u.Instance, u.Rule}
		switch u.Op {
		case LoadArm:
			if _, ok := t.since[k]; !ok {
				t.since[k] = u.At
			}
		case LoadClear:
			delete(t.since, k)
		case LoadChange:
			t.change[u.Instance] = u.At
		}
	}
}

// Forget drops what is known of an instance (it was deleted).
func (t *Tracker) Forget(instance string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.change, instance)
	for k := range t.since {
		if k[0] == instance {
			delete(t.since, k)
		}
	}
}
