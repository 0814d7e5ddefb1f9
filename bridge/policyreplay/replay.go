// Package policyreplay runs the events the bridge recorded in its inbox
// (table events) through two policies, the rules in force and a
// candidate, and reports per event the intents of each and where they
// differ: `vgpu-bridge policy replay` and POST /v1/policy/replay.
//
// A replay has no side effect: it reads in one read-only, repeatable-read
// transaction (Postgres refuses any write in it), evaluates the policies
// only (no claim, no command, no request, no audit row, no load-rule
// state written) and rolls back.
//
// What it reads, and as of when:
//   - the events: the inbox rows the bridge received in [Since, Until)
//     (received_at, the bridge's clock) and processed, oldest first; the
//     follow-ups of held rules (deferred copies) and notifications kept
//     unrecognized are left out. Events the retention purge deleted
//     ([retention] events) cannot be replayed;
//   - each event's state (its instance and vGPUs, the hosts' last agent
//     reports, the project's usage): as it is now, read once per event
//     (pipeline.StateReader); the bridge does not keep its state's
//     history;
//   - load rules' memory (for: windows, cooldowns): kept in memory, one
//     per policy, empty at Since and moved by the replayed decisions, so
//     each policy's windows run over the replayed events at their own
//     times. Held rules are reported held (with the end of their hold);
//     they are not evaluated again at that end.
package policyreplay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Bounds of a replay.
const (
	// DefaultMaxEvents is how many events a replay evaluates unless told.
	DefaultMaxEvents = 10000
	// MaxEvents is the most events one replay evaluates.
	MaxEvents = 1000000
	// fetch is how many rows a replay reads at a time.
	fetch = 256
	// maxFailures is how many failed events the summary lists (all are
	// counted).
	maxFailures = 100
)

// ErrInvalid marks a replay asked for wrongly (window, bound, policies).
var ErrInvalid = errors.New("invalid replay")

// Options are what to replay.
type Options struct {
	// Since and Until bound the window: events received at or after
	// Since and before Until.
	Since, Until time.Time
	// MaxEvents bounds the events evaluated (0: DefaultMaxEvents; at most
	// MaxEvents); the summary says when the window held more.
	MaxEvents int
	// Active is the policy in force, Candidate the one tried (required).
	Active, Candidate *policy.Policy
	// Catalog is the profile catalog the state is read with (may be nil).
	Catalog pipeline.Catalog
	// ClockSkew is [pipeline] clock_skew_tolerance (0: its default).
	ClockSkew time.Duration
	Log       *slog.Logger
}

// Validate checks the options.
func (o *Options) Validate() error {
	switch {
	case o.Active == nil || o.Candidate == nil:
		return fmt.Errorf("%w: the policy in force and the candidate are required", ErrInvalid)
	case o.Since.IsZero() || o.Until.IsZero():
		return fmt.Errorf("%w: since and until are required", ErrInvalid)
	case !o.Since.Before(o.Until):
		return fmt.Errorf("%w: since %s is not before until %s", ErrInvalid, o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	case o.MaxEvents < 0 || o.MaxEvents > MaxEvents:
		return fmt.Errorf("%w: max events %d: want 1 to %d", ErrInvalid, o.MaxEvents, MaxEvents)
	}
	return nil
}

// Side is what one policy decided about an event.
type Side struct {
	Intents  []policy.Intent `json:"intents"`
	Rejected bool            `json:"rejected,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	// Held are rules whose condition held but whose for: window or
	// cooldown held them back.
	Held []policy.Hold `json:"held,omitempty"`
	// RuleErrors are rules whose condition could not be evaluated
	// ("rule: detail").
	RuleErrors []string `json:"rule_errors,omitempty"`
}

// Event is one replayed event.
type Event struct {
	ID         int64     `json:"id"`
	Source     string    `json:"source"`
	Kind       string    `json:"kind,omitempty"`
	Instance   string    `json:"instance_uuid,omitempty"`
	Project    string    `json:"project_id,omitempty"`
	Time       time.Time `json:"time"`
	ReceivedAt time.Time `json:"received_at"`
	Active     *Side     `json:"active,omitempty"`
	Candidate  *Side     `json:"candidate,omitempty"`
	// Differs lists the intent kinds whose intents differ between the
	// two ("reject" when one rejects and the other does not).
	Differs []string `json:"differs,omitempty"`
	// Error says why the event could not be evaluated.
	Error string `json:"error,omitempty"`
}

// Failure is an event that could not be evaluated.
type Failure struct {
	ID     int64  `json:"id"`
	Reason string `json:"reason"`
}

// Summary counts a replay.
type Summary struct {
	Since           time.Time `json:"since"`
	Until           time.Time `json:"until"`
	ActivePolicy    string    `json:"active_policy"`
	CandidatePolicy string    `json:"candidate_policy"`
	// Events read; Evaluated through both policies; Failed could not be.
	Events    int `json:"events"`
	Evaluated int `json:"evaluated"`
	Failed    int `json:"failed"`
	// Differing events: at least one intent kind differs.
	Differing int `json:"differing"`
	// Differ counts, by intent kind (attach, release, resize, move, tune,
	// set_limits, notify, reject), the events where that kind differs.
	Differ map[string]int `json:"differ"`
	// Failures lists the first failed events, with the reason.
	Failures []Failure `json:"failures,omitempty"`
	// RuleErrors counts the rule conditions that could not be
	// evaluated, by policy ("active", "candidate").
	RuleErrors map[string]int `json:"rule_errors"`
	// Truncated: the window held more events than MaxEvents; only the
	// first were replayed.
	Truncated bool `json:"truncated"`
	MaxEvents int  `json:"max_events"`
}

// Kinds are the intent kinds the summary counts, in its order.
var Kinds = []string{string(policy.IntentAttach), string(policy.IntentRelease), string(policy.IntentResize), string(policy.IntentMove),
	string(policy.IntentTune), string(policy.IntentSetLimits), string(policy.IntentNotify), string(policy.IntentReject)}

// Run replays the window of o, calling emit with each event in order
// (oldest first) as it is evaluated, and returns the summary. An error of
// emit ends the replay with it.
func Run(ctx context.Context, pool *pgxpool.Pool, o Options, emit func(Event) error) (Summary, error) {
	if err := o.Validate(); err != nil {
		return Summary{}, err
	}
	if o.MaxEvents == 0 {
		o.MaxEvents = DefaultMaxEvents
	}
	sum := Summary{Since: o.Since.UTC(), Until: o.Until.UTC(), ActivePolicy: o.Active.Hash(), CandidatePolicy: o.Candidate.Hash(),
		Differ: map[string]int{}, RuleErrors: map[string]int{"active": 0, "candidate": 0}, MaxEvents: o.MaxEvents}
	for _, k := range Kinds {
		sum.Differ[k] = 0
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return sum, fmt.Errorf("replay: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only: nothing to keep
	sr, err := pipeline.NewStateReader(ctx, tx, o.Catalog, o.ClockSkew, o.Log)
	if err != nil {
		return sum, fmt.Errorf("replay: %w", err)
	}
	if _, err := tx.Exec(ctx, `DECLARE policy_replay NO SCROLL CURSOR FOR
		SELECT id, source, message_id, event_type, coalesce(instance_uuid::text, ''), occurred_at, received_at, payload,
			coalesce(request_id, ''), coalesce(project_id, '')
		FROM events
		WHERE processed_at IS NOT NULL AND received_at >= $1 AND received_at < $2
			AND deferred_from IS NULL AND status IS DISTINCT FROM 'unrecognized'
		ORDER BY received_at, id LIMIT $3`, o.Since, o.Until, o.MaxEvents+1); err != nil {
		return sum, fmt.Errorf("replay: read events: %w", err)
	}
	r := &replayer{o: o, sr: sr, tx: tx, active: policy.NewTracker(), candidate: policy.NewTracker()}
	batch := make([]pipeline.InboxRow, 0, fetch)
	for {
		batch = batch[:0]
		rows, err := tx.Query(ctx, fmt.Sprintf(`FETCH %d FROM policy_replay`, fetch))
		if err != nil {
			return sum, fmt.Errorf("replay: read events: %w", err)
		}
		for rows.Next() {
			var row pipeline.InboxRow
			var occurred *time.Time
			if err := rows.Scan(&row.ID, &row.Source, &row.MessageID, &row.EventType, &row.InstanceUUID, &occurred, &row.ReceivedAt,
				&row.Payload, &row.RequestID, &row.ProjectID); err != nil {
				rows.Close()
				return sum, fmt.Errorf("replay: read events: %w", err)
			}
			if occurred != nil {
				row.OccurredAt = *occurred
			}
			batch = append(batch, row)
		}
		if err := rows.Err(); err != nil {
			return sum, fmt.Errorf("replay: read events: %w", err)
		}
		for _, row := range batch {
			if sum.Events == o.MaxEvents {
				sum.Truncated = true
				return sum, nil
			}
			sum.Events++
			ev, err := r.one(ctx, row)
			if err != nil {
				return sum, err
			}
			sum.add(ev)
			if err := emit(ev); err != nil {
				return sum, err
			}
		}
		if len(batch) < fetch {
			return sum, nil
		}
	}
}

func (s *Summary) add(ev Event) {
	if ev.Error != "" {
		s.Failed++
		if len(s.Failures) < maxFailures {
			s.Failures = append(s.Failures, Failure{ID: ev.ID, Reason: ev.Error})
		}
		return
	}
	s.Evaluated++
	s.RuleErrors["active"] += len(ev.Active.RuleErrors)
	s.RuleErrors["candidate"] += len(ev.Candidate.RuleErrors)
	if len(ev.Differs) > 0 {
		s.Differing++
	}
	for _, k := range ev.Differs {
		s.Differ[k]++
	}
}

type replayer struct {
	o                 Options
	sr                *pipeline.StateReader
	tx                pgx.Tx
	active, candidate *policy.Tracker
}

// one evaluates one row with both policies. A row that does not map, or
// whose state cannot be read, is a failed event; an error of the
// transaction (the context ended, the connection broke) ends the replay.
func (r *replayer) one(ctx context.Context, row pipeline.InboxRow) (Event, error) {
	out := Event{ID: row.ID, Source: row.Source, Instance: row.InstanceUUID, Project: row.ProjectID, Time: row.OccurredAt, ReceivedAt: row.ReceivedAt}
	ev, err := r.sr.Event(row)
	if err != nil {
		out.Kind, out.Error = rawKind(row), "does not map to a policy event: "+err.Error()
		return out, nil
	}
	out.Kind, out.Time = ev.Kind, ev.Time
	if out.Instance == "" {
		out.Instance = ev.InstanceUUID
	}
	if !r.o.Active.Listens(ev.Kind) && !r.o.Candidate.Listens(ev.Kind) {
		// No rule of either listens: both decide nothing, and the state
		// is not read.
		out.Active, out.Candidate = &Side{Intents: []policy.Intent{}}, &Side{Intents: []policy.Intent{}}
		return out, nil
	}
	st, err := r.sr.State(ctx, r.tx, ev)
	if err != nil {
		if ctx.Err() != nil || r.tx.Conn().IsClosed() {
			return out, fmt.Errorf("replay: event %d: %w", row.ID, err)
		}
		out.Error = err.Error()
		return out, nil
	}
	a := pipeline.EvaluateOnly(r.o.Active, ev, st, r.active)
	c := pipeline.EvaluateOnly(r.o.Candidate, ev, st, r.candidate)
	r.active.Apply(a.LoadUpdates)
	r.candidate.Apply(c.LoadUpdates)
	if ev.Kind == pipeline.NovaKindPrefix+"instance.delete.end" && ev.InstanceUUID != "" {
		r.active.Forget(ev.InstanceUUID)
		r.candidate.Forget(ev.InstanceUUID)
	}
	out.Active, out.Candidate = side(a), side(c)
	out.Differs = differs(out.Active, out.Candidate)
	if out.Project == "" {
		out.Project = a.Project
	}
	return out, nil
}

// rawKind is the kind of a row that does not map, as it would have been.
func rawKind(row pipeline.InboxRow) string {
	switch {
	case row.Webhook():
		return "webhook." + row.EventType
	case row.Source == pipeline.BridgeSource:
		return pipeline.BridgeKindPrefix + row.EventType
	}
	return pipeline.NovaKindPrefix + row.EventType
}

func side(d *policy.Decision) *Side {
	s := &Side{Intents: d.Intents, Rejected: d.Rejected, Reason: d.Reason, Held: d.Held}
	if s.Intents == nil {
		s.Intents = []policy.Intent{}
	}
	for _, t := range d.Rules {
		if t.Outcome == policy.OutcomeError {
			s.RuleErrors = append(s.RuleErrors, t.Rule+": "+t.Detail)
		}
	}
	return s
}

// differs lists the intent kinds (Kinds order) whose intents differ: the
// same multiset of intents, compared without the rule that produced them
// and its explanation, is no difference.
func differs(a, c *Side) []string {
	ka, kc := keys(a), keys(c)
	var out []string
	for _, k := range Kinds {
		if k == string(policy.IntentReject) {
			if a.Rejected != c.Rejected || !equal(ka[k], kc[k]) {
				out = append(out, k)
			}
			continue
		}
		if !equal(ka[k], kc[k]) {
			out = append(out, k)
		}
	}
	return out
}

func keys(s *Side) map[string][]string {
	m := map[string][]string{}
	for _, in := range s.Intents {
		in.Rule, in.Why = "", ""
		b, _ := json.Marshal(in)
		m[string(in.Kind)] = append(m[string(in.Kind)], string(b))
	}
	for k := range m {
		sort.Strings(m[k])
	}
	return m
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Summarize renders an intent for the table: kind and arguments.
func Summarize(in policy.Intent) string {
	var b strings.Builder
	b.WriteString(string(in.Kind))
	switch in.Kind {
	case policy.IntentAttach:
		fmt.Fprintf(&b, "(%s x%d)", in.Profile, max(in.Count, 1))
	case policy.IntentRelease:
		if in.Profile != "" {
			fmt.Fprintf(&b, "(%s)", in.Profile)
		}
	case policy.IntentResize:
		fmt.Fprintf(&b, "(%s)", in.Profile)
	case policy.IntentMove:
		fmt.Fprintf(&b, "(off %s)", strings.Join(in.GPUs, ","))
	case policy.IntentTune:
		fmt.Fprintf(&b, "(%s,%d,%d)", in.Scheduler, in.TimesliceUS, in.ClocksMHz)
	case policy.IntentSetLimits:
		fmt.Fprintf(&b, "(%q,%q)", in.CPUMax, in.MemoryHigh)
	case policy.IntentNotify, policy.IntentReject:
		fmt.Fprintf(&b, "(%q)", in.Message)
	}
	return b.String()
}
