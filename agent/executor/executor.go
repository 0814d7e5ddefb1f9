// Package executor carries out the bridge's commands on the host
// (package agent/protocol): create and remove mdevs and vendor-VFIO VF types, attach
// and detach vGPUs live, in the config or cold, tune GPUs, set VM limits,
// verify vGPUs and collect diagnostics.
//
// Every command is idempotent by its id: the journal records its begin,
// each completed step and its result, so a duplicate delivery is answered
// with the recorded result and a command interrupted by a crash is resumed
// at restart from the step after the last one recorded (or rolled back
// when it has expired meanwhile) — never done twice. Each step also checks
// the host before acting, so a crash between a host change and its journal
// record does not repeat the change.
//
// A command for another host, past its expires_at, or malformed is
// refused and never executed. The executor creates, removes and recreates
// only devices its journal owns, and removes no mdev that a running domain
// still holds (remove_mdev is refused with code in_use: the kernel would
// not refuse it but wait, with the agent, for QEMU to let the device go).
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Config builds an Executor. Journal, Sysfs and Domains are required;
// GPUs, Limiter, Diagnoser and Health may be nil (their commands then fail
// with a code saying the facility is unavailable).
type Config struct {
	Host      string
	Journal   *journal.Journal
	Sysfs     Sysfs
	Domains   Domains
	GPUs      GPUs
	Limiter   Limiter
	Diagnoser Diagnoser
	// Bundler gathers collect_diagnostics bundles; nil fails those that
	// ask for one (unsupported).
	Bundler Bundler
	Health  Health
	Allow   AllowList // nil allows every device
	// ColdShutdownTimeout is the default graceful-shutdown bound of a cold
	// attach or detach. Default 2m.
	ColdShutdownTimeout time.Duration
	// ClockSkew is how far past expires_at a command is still accepted.
	ClockSkew time.Duration
	// CommandTimeout bounds one command's execution. Default 10m.
	CommandTimeout time.Duration
	// UpgradeCommand is the operator's driver-upgrade command (executable
	// and arguments) that upgrade_driver runs; empty refuses upgrade_driver.
	UpgradeCommand []string
	// RetypeCommand is the operator's re-type command that retype_gpus
	// runs; empty refuses retype_gpus.
	RetypeCommand []string
	// UpgradeTimeout bounds upgrade_driver and retype_gpus (instead of
	// CommandTimeout).
	// Default 30m.
	UpgradeTimeout time.Duration
	Now            func() time.Time
	Log            *slog.Logger
	// Registerer receives the command metrics when not nil.
	Registerer prometheus.Registerer
	// AfterStep, when set, runs after each step is journaled (a test hook:
	// crash tests stop the process there).
	AfterStep func(c protocol.Command, step string)
}

// Executor runs commands one at a time.
type Executor struct {
	cfg Config
	j   *journal.Journal
	log *slog.Logger
	mu  sync.Mutex

	outcomes *prometheus.CounterVec
	refused  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// changed is signalled after a command that may have changed the host.
	changed chan struct{}
}

// New checks cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	switch {
	case cfg.Host == "":
		return nil, errors.New("executor: Host is required")
	case cfg.Journal == nil:
		return nil, errors.New("executor: Journal is required")
	case cfg.Sysfs == nil:
		return nil, errors.New("executor: Sysfs is required")
	case cfg.Domains == nil:
		return nil, errors.New("executor: Domains is required")
	}
	if cfg.Allow == nil {
		cfg.Allow = allowAll{}
	}
	if cfg.ColdShutdownTimeout <= 0 {
		cfg.ColdShutdownTimeout = defaults().ColdShutdownTimeout
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = defaults().CommandTimeout
	}
	if cfg.UpgradeTimeout <= 0 {
		cfg.UpgradeTimeout = defaults().UpgradeTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	e := &Executor{cfg: cfg, j: cfg.Journal, log: cfg.Log, changed: make(chan struct{}, 1),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_agent_commands_total",
			Help: "Commands handled by the agent, by kind, status (succeeded, failed, refused) and code.",
		}, []string{"kind", "status", "code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpu_agent_commands_refused_total",
			Help: "Commands refused and never executed, by reason (the result code: bad_signature, unknown_key, " +
				"key_expired, wrong_host, expired, id_reused, invalid_command, not_owned, not_allowed, in_use, not_configured).",
		}, []string{"reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vgpu_agent_command_duration_seconds",
			Help:    "Time to execute a command (duplicates and refusals excluded).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"kind"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{e.outcomes, e.refused, e.duration} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("executor: metrics: %w", err)
			}
		}
	}
	return e, nil
}

// Changed is signalled (coalesced) after a command that may have changed
// the host, so the reporter sends a fresh report.
func (e *Executor) Changed() <-chan struct{} { return e.changed }

func (e *Executor) signalChange() {
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// Refuse returns a refusal of c (never executed, never journaled).
func (e *Executor) Refuse(c protocol.Command, code, msg string) protocol.Result {
	r := protocol.NewResult(&c, e.cfg.Host, protocol.Refused)
	r.Code, r.Message = code, msg
	r.FinishedAt = e.cfg.Now().UTC().Truncate(time.Millisecond)
	switch code {
	case protocol.CodeWrongHost:
		r.Remediation = "The command was routed to the wrong agent: check [DEFAULT] host of this agent against nova-compute's."
	case protocol.CodeExpired:
		r.Remediation = "The command waited longer than its expiry (agent down or queue backlog); re-issue it if still wanted."
	case protocol.CodeInvalidCommand:
		r.Remediation = "Fix the command; the bridge and the agent may disagree on the message contract version."
	case protocol.CodeNotOwned:
		r.Remediation = "The agent touches only mdevs and VF types it created; this one is Nova's or was made by hand."
	case protocol.CodeNotAllowed:
		r.Remediation = "Add the GPU and type to [devices] enabled_mdev_types and [mdev_<type>] device_addresses of the agent."
	case protocol.CodeBadSignature:
		r.Remediation = "The command is unsigned or was altered: check that the bridge signs commands ([security] signing_key_file) " +
			"and that nothing else publishes on the agent's queue (etc/rabbitmq/)."
	case protocol.CodeUnknownKey:
		r.Remediation = "Add the bridge's current public key to the agent's [security] bridge_keys_file and send the agent SIGHUP."
	case protocol.CodeKeyExpired:
		r.Remediation = "The bridge signed with a key whose grace period ended: make the bridge sign with the new key."
	case protocol.CodeIDReused:
		r.Remediation = "A command id is used once; the bridge must give a new command a new id."
	case protocol.CodeNotConfigured:
		r.Remediation = "Set [DEFAULT] driver_upgrade_command (upgrade_driver) or gpu_retype_command (retype_gpus) in the " +
			"agent's configuration, then restart the agent."
	case string(hosterr.InUse):
		r.Remediation = "The mdev is attached to a running VM: detach it (detach_vgpu) first, then remove it."
	}
	kind := string(c.Kind)
	if !c.Kind.Valid() {
		kind = "unknown" // bounded label values whatever the message says
	}
	e.outcomes.WithLabelValues(kind, string(r.Status), r.Code).Inc()
	e.refused.WithLabelValues(r.Code).Inc()
	return r
}

// Execute handles one command and returns its result: the recorded one for
// a duplicate, a refusal, or the outcome of running it now.
func (e *Executor) Execute(ctx context.Context, c protocol.Command) protocol.Result {
	e.mu.Lock()
	defer e.mu.Unlock()
	log := e.log.With(logkey.Command, c.ID, logkey.Kind, string(c.Kind))
	if c.ID == "" {
		return e.Refuse(c, protocol.CodeInvalidCommand, "command has no id")
	}
	if ent, ok := e.j.Lookup(c.ID); ok {
		if !sameCommand(ent.Command, c) {
			log.Warn("refused: command id already used for another command", logkey.Reason, protocol.CodeIDReused)
			return e.Refuse(c, protocol.CodeIDReused, fmt.Sprintf("command id %q was already used for another command", c.ID))
		}
		if ent.Finished() {
			log.Info("duplicate command; answering the recorded result", "status", ent.Result.Status)
			return *ent.Result
		}
		// Begun, not finished: only possible when Recover has not run or
		// failed; resume it here.
		log.Warn("resuming an interrupted command")
		return e.resume(ctx, ent)
	}
	if c.Host != e.cfg.Host {
		log.Warn("refused: command for another host", logkey.Reason, protocol.CodeWrongHost, "command_host", c.Host)
		return e.Refuse(c, protocol.CodeWrongHost, fmt.Sprintf("command is for host %q, this agent is %q", c.Host, e.cfg.Host))
	}
	if c.ExpiresAt.IsZero() || c.Expired(e.cfg.Now(), e.cfg.ClockSkew) {
		log.Warn("refused: command expired", logkey.Reason, protocol.CodeExpired, "expires_at", c.ExpiresAt)
		return e.Refuse(c, protocol.CodeExpired, fmt.Sprintf("command expired at %s", c.ExpiresAt.UTC().Format(time.RFC3339)))
	}
	if err := c.Validate(); err != nil {
		return e.Refuse(c, protocol.CodeInvalidCommand, err.Error())
	}
	h, err := e.prepare(c)
	if err != nil {
		log.Warn("refused", logkey.Err, err)
		return e.refusal(c, err)
	}
	if err := e.j.Begin(c); err != nil {
		log.Error("journal", logkey.Err, err)
		return e.fail(c, hosterr.New(hosterr.Internal, "journal", err))
	}
	ent, _ := e.j.Lookup(c.ID)
	return e.run(ctx, ent, h)
}

// sameCommand reports whether a delivery with an id the journal knows is
// that command again: same kind, host, request, instance and params. The
// signature and times may differ (a re-signed retry after a key rotation).
func sameCommand(a, b protocol.Command) bool {
	if a.Kind != b.Kind || a.Host != b.Host || a.RequestID != b.RequestID || !strings.EqualFold(a.InstanceUUID, b.InstanceUUID) {
		return false
	}
	return canonicalParams(a.Params) == canonicalParams(b.Params)
}

func canonicalParams(p json.RawMessage) string {
	t := strings.TrimSpace(string(p))
	if t == "" || t == "null" {
		return ""
	}
	c, err := protocol.Canonical([]byte(`{"p":` + t + `}`))
	if err != nil {
		return t
	}
	return string(c)
}

// refusalError is a reason to refuse before anything is done.
type refusalError struct{ code, msg string }

func (r *refusalError) Error() string { return r.msg }

func refuse(code, format string, args ...any) error {
	return &refusalError{code: code, msg: fmt.Sprintf(format, args...)}
}

func (e *Executor) refusal(c protocol.Command, err error) protocol.Result {
	var re *refusalError
	if errors.As(err, &re) {
		return e.Refuse(c, re.code, re.msg)
	}
	return e.Refuse(c, protocol.CodeInvalidCommand, err.Error())
}

func (e *Executor) resume(ctx context.Context, ent journal.Entry) protocol.Result {
	h, err := e.prepare(ent.Command)
	if err != nil {
		// Was valid when begun; cannot happen unless the agent changed.
		return e.finish(ent.Command, e.Refuse(ent.Command, protocol.CodeInvalidCommand, err.Error()))
	}
	return e.run(ctx, ent, h)
}

// run executes a journaled command from its first step not yet done.
func (e *Executor) run(ctx context.Context, ent journal.Entry, h handler) protocol.Result {
	c := ent.Command
	timeout := e.cfg.CommandTimeout
	if c.Kind == protocol.UpgradeDriver || c.Kind == protocol.RetypeGPUs {
		timeout = e.cfg.UpgradeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	r := &run{e: e, c: c, ent: ent}
	details, err := h(ctx, r)
	e.duration.WithLabelValues(string(c.Kind)).Observe(time.Since(start).Seconds())
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// The agent is stopping: leave the command pending; it resumes at
		// restart (the delivery is not acknowledged either).
		return protocol.Result{}
	}
	var res protocol.Result
	if err != nil {
		res = e.failure(c, err)
		e.log.Warn("command failed", logkey.Command, c.ID, logkey.Kind, string(c.Kind), logkey.Code, res.Code, logkey.Err, err)
	} else {
		res = protocol.NewResult(&c, e.cfg.Host, protocol.Succeeded)
		res.Message = "done"
		e.log.Info("command succeeded", logkey.Command, c.ID, logkey.Kind, string(c.Kind), "steps", r.names())
	}
	if details == nil {
		details = map[string]any{}
	}
	if m, ok := details.(map[string]any); ok && len(r.ent.Steps) > 0 {
		m["steps"] = r.names()
	}
	if b, jerr := json.Marshal(details); jerr == nil && string(b) != "{}" {
		res.Details = b
	}
	if c.Kind != protocol.VerifyVGPU && c.Kind != protocol.CollectDiagnostics {
		// After upgrade_driver too: the next report carries the driver now
		// loaded.
		e.signalChange()
	}
	return e.finish(c, res)
}

func (e *Executor) finish(c protocol.Command, res protocol.Result) protocol.Result {
	// A diagnostics bundle (up to [diagnostics] max_bundle_bytes) is not
	// kept in the journal: a duplicate delivery gets the result without
	// it (bundle_omitted) and the operator asks again.
	full := res.Details
	if c.Kind == protocol.CollectDiagnostics {
		res.Details = withoutBundle(res.Details)
	}
	rec, err := e.j.Finish(c.ID, res)
	if err != nil {
		e.log.Error("journal: cannot record result", logkey.Command, c.ID, logkey.Err, err)
		return protocol.Result{}
	}
	rec.Details = full
	e.outcomes.WithLabelValues(string(c.Kind), string(rec.Status), rec.Code).Inc()
	return rec
}

func (e *Executor) fail(c protocol.Command, err error) protocol.Result {
	res := e.failure(c, err)
	res.FinishedAt = e.cfg.Now().UTC().Truncate(time.Millisecond)
	e.outcomes.WithLabelValues(string(c.Kind), string(res.Status), res.Code).Inc()
	return res
}

// failure turns an error into a failed (or refused) result.
func (e *Executor) failure(c protocol.Command, err error) protocol.Result {
	var re *refusalError
	if errors.As(err, &re) {
		r := e.Refuse(c, re.code, re.msg)
		r.FinishedAt = time.Time{}
		return r
	}
	r := protocol.NewResult(&c, e.cfg.Host, protocol.Failed)
	r.Message = err.Error()
	var ce codedError
	if errors.As(err, &ce) {
		r.Code, r.Remediation, r.NvidiaCode = ce.code, ce.remediation, ce.nvidia
		return r
	}
	code := hosterr.CodeOf(err)
	r.Code = string(code)
	r.NvidiaCode = hosterr.NvidiaCode(code)
	r.Remediation = hosterr.Remediation(code)
	if errors.Is(err, context.DeadlineExceeded) {
		r.Code = string(hosterr.Timeout)
		r.Remediation = "The command took longer than [DEFAULT] command_timeout; check the host (libvirt, guest shutdown) and re-issue."
	}
	return r
}

// codedError is a failure with an agent code (not a host error).
type codedError struct {
	code, msg, remediation string
	nvidia                 int
}

func (c codedError) Error() string { return c.msg }

// run is one execution of a command: its steps.
type run struct {
	e   *Executor
	c   protocol.Command
	ent journal.Entry
}

// step runs fn unless the journal says step name is done, then journals
// it. It returns the step's data (fn's, or the recorded one).
func (r *run) step(name string, fn func() (string, error)) (string, error) {
	if s, ok := r.ent.Done(name); ok {
		return s.Data, nil
	}
	data, err := fn()
	if err != nil {
		return "", err
	}
	if err := r.e.j.StepDone(r.c.ID, name, data); err != nil {
		return "", hosterr.New(hosterr.Internal, "journal step "+name, err)
	}
	r.ent.Steps = append(r.ent.Steps, journal.Step{Name: name, Data: data})
	r.e.log.Debug("step done", logkey.Command, r.c.ID, logkey.Step, name)
	if r.e.cfg.AfterStep != nil {
		r.e.cfg.AfterStep(r.c, name)
	}
	return data, nil
}

func (r *run) done(name string) bool {
	_, ok := r.ent.Done(name)
	return ok
}

func (r *run) names() []string {
	out := make([]string, len(r.ent.Steps))
	for i, s := range r.ent.Steps {
		out[i] = s.Name
	}
	return out
}

// handler executes a command's steps and returns the result's details.
type handler func(ctx context.Context, r *run) (any, error)

func equalFoldUUID(a, b string) bool { return a != "" && strings.EqualFold(a, b) }

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return b
}

// withoutBundle is a collect_diagnostics result's details without the
// bundle itself (its digest and manifest stay).
func withoutBundle(details json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if len(details) == 0 || json.Unmarshal(details, &m) != nil || m["bundle"] == nil {
		return details
	}
	delete(m, "bundle")
	m["bundle_omitted"] = json.RawMessage(`"the bundle is not kept in the agent's journal; collect it again"`)
	b, err := json.Marshal(m)
	if err != nil {
		return details
	}
	return b
}
