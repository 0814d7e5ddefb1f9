package pipeline

import (
	"context"
	"fmt"

	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// A request (a webhook's, one made through POST /v1/requests) may name a
// server that Nova has and the bridge has not heard of yet: created before
// the bridge, and not listed yet ([nova] server_sync_interval). The
// decision that finds such an instance unknown stops (errLookup, its
// transaction rolled back); Deps.Lookup asks Nova for that one server with
// no transaction open and stores it as a listing does; the event is then
// decided again, once, with the instance known, or with Nova's no
// (InstanceFacts.Absent). Nova unreachable: the event is retried with
// backoff like any transient failure, up to [pipeline] max_attempts.

// errLookup stops a decision whose request names an unknown instance.
type errLookup struct{ instance, project string }

func (e errLookup) Error() string {
	return fmt.Sprintf("instance %s is unknown: look it up in Nova first", e.instance)
}

// lookedUp is what Nova answered about the instance.
type lookedUp struct{ found bool }

// needLookup returns errLookup when the decision should ask Nova for its
// instance before going on: a request's event, an instance the bridge has
// no row of, Nova configured (canAsk), not asked yet in this decision.
// After the lookup it marks the facts: Absent when Nova has no such
// server.
func (w *Work) needLookup(f *Facts, st *snapshot, canAsk bool) error {
	if w.looked != nil && !w.looked.found {
		// Nova has no such server, or it is not in the event's project
		// (stored all the same): the decision sees no instance.
		f.Instance = InstanceFacts{UUID: f.Instance.UUID, Absent: true}
		f.Attachments = nil
		if st != nil {
			st.inst = policy.Instance{}
		}
		return nil
	}
	if f.Instance.Known || f.Instance.UUID == "" || !w.HasRequest || !canAsk || w.looked != nil {
		return nil
	}
	// The project the event was queued under, when it has one: a server
	// of another project is as absent.
	return errLookup{instance: f.Instance.UUID, project: w.Row.ProjectID}
}

// lookUp asks Nova for the instance of nl (no transaction open); an error
// retries the event later.
func (p *Processor) lookUp(ctx context.Context, nl errLookup) (*lookedUp, error) {
	found, err := p.d.Lookup.LookUp(ctx, nl.instance, nl.project)
	if err != nil {
		return nil, errRetry{fmt.Errorf("instance %s is not known to the bridge, and Nova could not be asked for it: %w", nl.instance, err)}
	}
	return &lookedUp{found: found}, nil
}
