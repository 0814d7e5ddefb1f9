package policy

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// noLoad is the LoadState of callers that pass nil.
type noLoad struct{}

func (noLoad) Since(string, string) (time.Time, bool) { return time.Time{}, false }
func (noLoad) LastChange(string) (time.Time, bool)    { return time.Time{}, false }

// emptyState is the State of callers that pass nil.
type emptyState struct{}

func (emptyState) Instance(string) (Instance, bool) { return Instance{}, false }
func (emptyState) Host(string) (Host, bool)         { return Host{}, false }
func (emptyState) Hosts() []Host                    { return nil }
func (emptyState) ProjectUsage(string) Usage        { return Usage{} }

// evaluation is the working state of one Evaluate call.
type evaluation struct {
	p       *Policy
	ev      Event
	now     time.Time
	inst    Instance
	host    Host
	hosts   []Host
	project Project
	quota   Quota
	usage   Usage // updated as intents are accepted
	// limits are the project's unified limits (LimitState), their usage
	// updated as intents are accepted; nil when not enforced.
	limits  []UnifiedLimit
	vmCount int // the instance's vGPUs, updated likewise
	guest   string
	d       *Decision
	// valCache holds the explanation values already read in this
	// evaluation: rules share paths such as event.workload.
	valCache map[string]string
	valBuf   []Value
	// quotaWhy are the reasons quotaCheck gave in this evaluation: a
	// refusal that holds one is coded RefusalQuota.
	quotaWhy []string
}

// Evaluate decides what to do about an event. st and ls may be nil. It does
// no I/O and, given the same inputs, returns the same decision.
//
// A rule whose condition holds but whose for: window or cooldown holds it
// back is listed in the decision's Held, with the time its hold ends: the
// caller evaluates the event again then (EvaluateHeld), so that what the
// rule would do is not dropped when no further event comes.
func (p *Policy) Evaluate(ev Event, st State, ls LoadState) *Decision {
	return p.evaluate(ev, st, ls, nil)
}

// EvaluateHeld evaluates an event again for the rules an earlier decision
// held back (Decision.Held): only the rules named in rules run, against
// the state and load state given, at ev.Time (the time of the
// re-evaluation); the others are listed as skipped. A rule held back
// again is listed in Held again. Rules no longer in the policy are not
// run.
func (p *Policy) EvaluateHeld(ev Event, st State, ls LoadState, rules []string) *Decision {
	only := make(map[string]bool, len(rules))
	for _, r := range rules {
		only[r] = true
	}
	return p.evaluate(ev, st, ls, only)
}

func (p *Policy) evaluate(ev Event, st State, ls LoadState, only map[string]bool) *Decision {
	if st == nil {
		st = emptyState{}
	}
	if ls == nil {
		ls = noLoad{}
	}
	now := ev.Time
	if now.IsZero() {
		now = p.clock()
	}
	e := &evaluation{p: p, ev: ev, now: now, valCache: map[string]string{}}
	if ev.InstanceUUID != "" {
		e.inst, _ = st.Instance(ev.InstanceUUID)
	}
	if e.inst.UUID == "" {
		e.inst.UUID = ev.InstanceUUID
	}
	if e.inst.VGPUCount == 0 {
		for _, v := range e.inst.VGPUs {
			e.inst.VGPUCount += v.Count
		}
	}
	if e.inst.Profile == "" && len(e.inst.VGPUs) > 0 {
		e.inst.Profile = e.inst.VGPUs[0].Profile
	}
	projectID := ev.ProjectID
	if projectID == "" {
		projectID = e.inst.ProjectID
	}
	if e.inst.Host != "" {
		e.host, _ = st.Host(e.inst.Host)
		if e.host.Name == "" {
			e.host.Name = e.inst.Host
		}
	}
	e.hosts = st.Hosts()
	e.usage = st.ProjectUsage(projectID)
	if ls, ok := st.(LimitState); ok {
		e.limits = append([]UnifiedLimit(nil), ls.ProjectLimits(projectID)...) // a copy: accepted intents add to it
	}
	e.vmCount = e.inst.VGPUCount
	e.quota = p.projectQuota(projectID)
	mode, _ := p.attachMode(projectID, "")
	e.project = Project{
		ID: projectID, VGPUs: e.usage.VGPUs, FramebufferGiB: float64(e.usage.FramebufferMiB) / 1024,
		MaxVGPUs: deref(e.quota.MaxVGPUs), MaxFramebufferGiB: deref(e.quota.MaxFramebufferGiB), MaxVGPUsPerVM: deref(e.quota.MaxVGPUsPerVM),
		AllowedProfiles: e.quota.AllowedProfiles, AttachMode: string(mode),
	}
	for _, s := range e.quota.AllowedSeries {
		e.project.AllowedSeries = append(e.project.AllowedSeries, string(s))
	}
	e.guest = ev.GuestDriver
	if e.guest == "" {
		e.guest = e.inst.GuestDriver
	}
	rules := p.rulesFor(ev.Kind)
	d := &Decision{Kind: ev.Kind, Instance: e.inst.UUID, Project: projectID, Time: now, Policy: p.hash,
		Intents: make([]Intent, 0, 2), Rules: make([]RuleTrace, 0, len(rules)), LoadUpdates: make([]LoadUpdate, 0, 4)}
	e.d = d
	count := ev.Count
	if count <= 0 {
		count = 1
	}
	d.Preferred, d.PreferredWhy = e.preferred(count)

	metrics := ev.Metrics
	if metrics == nil {
		metrics = map[string]float64{}
	}
	act, _ := interpreter.NewActivation(map[string]any{
		varEvent:     &ev,
		varInstance:  &e.inst,
		varHost:      &e.host,
		varMetrics:   metrics,
		varProject:   &e.project,
		varPreferred: d.Preferred,
		varNow:       now,
	})
	d.OtherRules = len(p.rules) - len(rules)
	raw := make([]Intent, 0, 4)
	for i, r := range rules {
		tr := RuleTrace{Rule: r.Name, Line: r.Line, Col: r.Col}
		if only != nil && !only[r.Name] {
			tr.Outcome, tr.Detail = OutcomeSkipped, "evaluated again for the rules held back only; this one was not"
			d.Rules = append(d.Rules, tr)
			continue
		}
		if !r.always {
			tr.Values = r.values(e, act)
		}
		held, err := r.holds(act)
		switch {
		case err != nil:
			tr.Outcome, tr.Detail = OutcomeError, err.Error()
			e.clearArm(ls, r)
		case !held:
			tr.Outcome, tr.Detail = OutcomeFalse, "condition is false"
			e.clearArm(ls, r)
		default:
			if ok, detail := e.loadGate(ls, r); !ok {
				tr.Outcome, tr.Detail = detail.outcome, detail.text
				if !detail.until.IsZero() {
					d.Held = append(d.Held, Hold{Rule: r.Name, Until: detail.until})
				}
				break
			}
			tr.Outcome = OutcomeFired
			why := r.why(tr.Values)
			for j, prg := range r.then {
				out, _, err := prg.Eval(act)
				if err != nil {
					tr.Detail += fmt.Sprintf("then %q failed: %v; ", r.thenText[j], err)
					continue
				}
				iv, ok := out.(intentVal)
				if !ok {
					continue
				}
				in := iv.in
				in.Rule = r.Name
				in.Why = why
				raw = append(raw, in)
			}
			tr.Detail = strings.TrimSuffix(tr.Detail, "; ")
		}
		d.Rules = append(d.Rules, tr)
		if tr.Outcome == OutcomeFired && r.Final {
			for _, rest := range rules[i+1:] {
				d.Rules = append(d.Rules, RuleTrace{Rule: rest.Name, Line: rest.Line, Col: rest.Col, Outcome: OutcomeSkipped, Detail: fmt.Sprintf("rule %s is final and fired", r.Name)})
			}
			break
		}
	}
	e.resolve(raw, count)
	e.tuneRequest()
	e.finish()
	return d
}

// holds evaluates the rule's condition.
func (r *rule) holds(act interpreter.Activation) (bool, error) {
	if r.always {
		return true, nil
	}
	out, _, err := r.when.Eval(act)
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("condition gave %v", out)
	}
	return bool(b), nil
}

// values reads what the condition reads, for the explanation.
func (r *rule) values(e *evaluation, act interpreter.Activation) []Value {
	cache := e.valCache
	if len(r.paths) == 0 {
		return nil
	}
	// One backing array per evaluation, carved up rule by rule.
	if cap(e.valBuf)-len(e.valBuf) < len(r.paths) {
		e.valBuf = make([]Value, 0, 64+len(r.paths))
	}
	start := len(e.valBuf)
	for _, vp := range r.paths {
		s, ok := cache[vp.text]
		if !ok {
			if vp.acc != nil {
				s = vp.acc.read(e)
			} else {
				v, _, err := vp.prg.Eval(act)
				s = "<absent>"
				if err == nil {
					s = formatVal(v)
				}
			}
			cache[vp.text] = s
		}
		e.valBuf = append(e.valBuf, Value{Path: vp.text, Value: s})
	}
	return e.valBuf[start:len(e.valBuf):len(e.valBuf)]
}

func (r *rule) why(vals []Value) string {
	var b strings.Builder
	b.WriteString("rule ")
	b.WriteString(r.Name)
	b.WriteString(" (line ")
	b.WriteString(strconv.Itoa(r.Line))
	b.WriteString(") fired")
	if len(vals) > 0 {
		b.WriteString(" with ")
		for i, v := range vals {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(v.Path)
			b.WriteByte('=')
			b.WriteString(v.Value)
		}
	}
	if r.For > 0 {
		b.WriteString(", held for ")
		b.WriteString(r.For.String())
	}
	return b.String()
}

// formatVal renders a CEL value compactly and deterministically.
func formatVal(v ref.Val) string {
	switch x := v.Value().(type) {
	case string:
		return strconv.Quote(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case int64:
		return strconv.FormatInt(x, 10)
	case bool:
		return strconv.FormatBool(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case time.Duration:
		return x.String()
	case int:
		return strconv.Itoa(x)
	case []string:
		return "[" + strings.Join(x, ", ") + "]"
	case map[string]string:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ":" + strconv.Quote(x[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case map[string]float64:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ":" + strconv.FormatFloat(x[k], 'g', -1, 64)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v.Value())
}

type gateDetail struct {
	outcome Outcome
	text    string
	until   time.Time // when the hold ends (holding, cooldown)
}

// loadGate applies a load rule's "for" and "cooldown". It returns true
// when the rule may fire.
func (e *evaluation) loadGate(ls LoadState, r *rule) (bool, gateDetail) {
	if r.For == 0 && r.Cooldown == 0 {
		return true, gateDetail{}
	}
	id := e.inst.UUID
	if id == "" {
		return false, gateDetail{outcome: OutcomeError, text: "a load rule needs the event's instance"}
	}
	if r.For > 0 {
		since, ok := ls.Since(id, r.Name)
		if !ok || since.After(e.now) {
			e.d.LoadUpdates = append(e.d.LoadUpdates, LoadUpdate{Op: LoadArm, Instance: id, Rule: r.Name, At: e.now})
			return false, gateDetail{OutcomeHolding, fmt.Sprintf("condition holds since now; needs %s", r.For), e.now.Add(r.For)}
		}
		if held := e.now.Sub(since); held < r.For {
			return false, gateDetail{OutcomeHolding, fmt.Sprintf("condition holds for %s of %s (since %s)", held, r.For, since.UTC().Format(time.RFC3339)), since.Add(r.For)}
		}
	}
	if r.Cooldown > 0 {
		if last, ok := ls.LastChange(id); ok && e.now.Sub(last) < r.Cooldown {
			return false, gateDetail{OutcomeCooldown, fmt.Sprintf("instance changed at %s; cooldown %s until %s", last.UTC().Format(time.RFC3339), r.Cooldown, last.Add(r.Cooldown).UTC().Format(time.RFC3339)), last.Add(r.Cooldown)}
		}
	}
	if r.For > 0 {
		// Fired: the condition must hold for a whole window again.
		e.d.LoadUpdates = append(e.d.LoadUpdates, LoadUpdate{Op: LoadClear, Instance: id, Rule: r.Name, At: e.now})
	}
	return true, gateDetail{}
}

// clearArm forgets a load rule's start when its condition stops holding.
func (e *evaluation) clearArm(ls LoadState, r *rule) {
	if r.For == 0 || e.inst.UUID == "" {
		return
	}
	if _, ok := ls.Since(e.inst.UUID, r.Name); ok {
		e.d.LoadUpdates = append(e.d.LoadUpdates, LoadUpdate{Op: LoadClear, Instance: e.inst.UUID, Rule: r.Name, At: e.now})
	}
}

// gpuModels returns the GPU models candidates may have: the models of the
// known hosts, nil when none are known (any model).
func (e *evaluation) gpuModels() map[string]bool {
	var m map[string]bool
	add := func(h Host) {
		for _, g := range h.GPUs {
			if m == nil {
				m = map[string]bool{}
			}
			m[g.Model] = true
		}
	}
	add(e.host)
	for _, h := range e.hosts {
		add(h)
	}
	return m
}

// preferred picks the profile for the event: the requested one, else the
// workload's preference within the project's quota.
func (e *evaluation) preferred(count int) (string, string) {
	p := e.p
	if e.ev.Profile != "" {
		prof, ok := p.cat.ByName(e.ev.Profile)
		if !ok {
			return "", fmt.Sprintf("requested profile %q is not in the profile catalog", e.ev.Profile)
		}
		return prof.Name, "requested by the event"
	}
	wl := e.ev.Workload
	if wl == "" {
		wl = e.inst.Workload
	}
	if wl == "" {
		return "", "the event names neither a profile nor a workload"
	}
	pref, ok := p.workload(e.project.ID, wl)
	if !ok {
		return "", fmt.Sprintf("workload %q has no profile preference", wl)
	}
	models := e.gpuModels()
	var cands []catalog.Profile
	var lastWhy string
	consider := func(prof catalog.Profile) {
		if models != nil && !models[prof.GPU] {
			lastWhy = fmt.Sprintf("no known host has a %s", prof.GPU)
			return
		}
		if !e.quotaFits(prof, count, false) {
			lastWhy = e.quotaCheck(prof, count, false)
			return
		}
		cands = append(cands, prof)
	}
	if len(pref.Profiles) > 0 {
		for _, name := range pref.Profiles {
			if prof, ok := p.cat.ByName(name); ok {
				consider(prof)
				if len(cands) > 0 {
					return cands[0].Name, fmt.Sprintf("workload %s: first listed profile that fits", wl)
				}
			}
		}
		return "", fmt.Sprintf("workload %s: no listed profile fits (%s)", wl, lastWhy)
	}
	for _, prof := range p.profileList() {
		if !seriesIn(prof.Series, pref.Series) {
			continue
		}
		if pref.MinFramebufferGiB > 0 && prof.FramebufferMiB < pref.MinFramebufferGiB*1024 {
			continue
		}
		if pref.MaxFramebufferGiB > 0 && prof.FramebufferMiB > pref.MaxFramebufferGiB*1024 {
			continue
		}
		consider(prof)
	}
	series := make([]string, len(pref.Series))
	for i, s := range pref.Series {
		series[i] = string(s)
	}
	what := fmt.Sprintf("workload %s: %s of series %s that fits", wl, pref.Choose, strings.Join(series, "/"))
	if len(cands) == 0 {
		if lastWhy == "" {
			lastWhy = "no such profile in the catalog"
		}
		return "", what + ": none (" + lastWhy + ")"
	}
	best := cands[0]
	for _, c := range cands[1:] {
		if pref.Choose == ChooseLargest && c.FramebufferMiB > best.FramebufferMiB ||
			pref.Choose != ChooseLargest && c.FramebufferMiB < best.FramebufferMiB {
			best = c
		}
	}
	return best.Name, what
}

func seriesIn(s catalog.Series, list []catalog.Series) bool {
	if len(list) == 0 {
		return true
	}
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// quotaFits is quotaCheck without the reason, for the preference loop.
func (e *evaluation) quotaFits(prof catalog.Profile, count int, resize bool) bool {
	q := e.quota
	if len(q.AllowedProfiles) > 0 && !contains(q.AllowedProfiles, prof.Name) || len(q.AllowedSeries) > 0 && !seriesIn(prof.Series, q.AllowedSeries) {
		return false
	}
	addVGPUs, addFB := e.delta(prof, count, resize)
	if m := deref(q.MaxVGPUsPerVM); m > 0 && e.vmCount+addVGPUs > m {
		return false
	}
	if m := deref(q.MaxVGPUs); m > 0 && e.usage.VGPUs+addVGPUs > m {
		return false
	}
	if m := deref(q.MaxFramebufferGiB); m > 0 && e.usage.FramebufferMiB+addFB > m*1024 {
		return false
	}
	return e.limitReason(prof, count, resize) == ""
}

// limitDelta is what an intent adds to unified limit l: every vGPU an
// attach adds counts in class:VGPU and in its profile's limit; a resize
// adds none to class:VGPU (the count stays) and moves the instance's
// vGPUs into the target profile's limit.
func (e *evaluation) limitDelta(l UnifiedLimit, prof catalog.Profile, count int, resize bool) int {
	switch {
	case l.Profile != "" && l.Profile != prof.Name:
		return 0
	case !resize:
		return count
	case l.Profile == "":
		return 0
	}
	return e.vmCount
}

// limitReason says which of the project's unified limits the intent
// would exceed (oslo_limit.limit._EnforcerUtils.enforce_limits:
// usage + delta > limit), naming the limit, the usage and the request;
// "" if none.
func (e *evaluation) limitReason(prof catalog.Profile, count int, resize bool) string {
	for _, l := range e.limits {
		d := e.limitDelta(l, prof, count, resize)
		if d > 0 && l.Usage+d > l.Limit {
			return fmt.Sprintf("project %s would exceed its Keystone unified limit %s: limit %d, usage %d, request %d",
				cmp.Or(e.project.ID, "(unknown)"), l.Resource, l.Limit, l.Usage, d)
		}
	}
	return ""
}

// delta is what an intent adds to the project's vGPUs and framebuffer.
func (e *evaluation) delta(prof catalog.Profile, count int, resize bool) (int, int) {
	if !resize {
		return count, count * prof.FramebufferMiB
	}
	if cur, ok := e.p.cat.ByName(e.inst.Profile); ok {
		return 0, e.vmCount * (prof.FramebufferMiB - cur.FramebufferMiB)
	}
	return 0, 0
}

// quotaCheck says why adding count vGPUs of prof (or, with resize, moving
// the instance's vGPUs to prof) would break the project's quota; "" if it
// would not.
func (e *evaluation) quotaCheck(prof catalog.Profile, count int, resize bool) string {
	why := e.quotaReason(prof, count, resize)
	if why != "" {
		e.quotaWhy = append(e.quotaWhy, why)
	}
	return why
}

func (e *evaluation) quotaReason(prof catalog.Profile, count int, resize bool) string {
	q := e.quota
	pid := e.project.ID
	if pid == "" {
		pid = "(unknown)"
	}
	if len(q.AllowedProfiles) > 0 && !contains(q.AllowedProfiles, prof.Name) {
		return fmt.Sprintf("profile %s is not allowed for project %s (allowed: %s)", prof.Name, pid, strings.Join(q.AllowedProfiles, ", "))
	}
	if len(q.AllowedSeries) > 0 && !seriesIn(prof.Series, q.AllowedSeries) {
		return fmt.Sprintf("series %s of %s is not allowed for project %s", prof.Series, prof.Name, pid)
	}
	addVGPUs, addFB := e.delta(prof, count, resize)
	if m := deref(q.MaxVGPUsPerVM); m > 0 && e.vmCount+addVGPUs > m {
		return fmt.Sprintf("the instance would hold %d vGPUs; project %s allows %d per VM", e.vmCount+addVGPUs, pid, m)
	}
	if m := deref(q.MaxVGPUs); m > 0 && e.usage.VGPUs+addVGPUs > m {
		return fmt.Sprintf("project %s would hold %d vGPUs; its quota is %d", pid, e.usage.VGPUs+addVGPUs, m)
	}
	if m := deref(q.MaxFramebufferGiB); m > 0 && e.usage.FramebufferMiB+addFB > m*1024 {
		return fmt.Sprintf("project %s would hold %s GiB of vGPU framebuffer; its quota is %d GiB", pid, gib(e.usage.FramebufferMiB+addFB), m)
	}
	return e.limitReason(prof, count, resize)
}

func gib(mib int) string {
	return strconv.FormatFloat(float64(mib)/1024, 'f', -1, 64)
}

// resolve turns the rules' raw intents into checked intents and refusals.
func (e *evaluation) resolve(raw []Intent, count int) {
	d := e.d
	if cap(d.Intents) < len(raw) {
		d.Intents = make([]Intent, 0, len(raw))
	}
	var rejects []Intent
	for _, in := range raw {
		if in.Kind == IntentReject {
			in.Instance = e.inst.UUID
			rejects = append(rejects, in)
		}
	}
	for _, in := range raw {
		in.Instance = e.inst.UUID
		if len(rejects) > 0 && in.Kind != IntentNotify {
			if in.Kind != IntentReject {
				d.Refused = append(d.Refused, Refusal{Intent: in, Reason: fmt.Sprintf("rule %s rejected the event", rejects[0].Rule)})
			}
			continue
		}
		var reason string
		switch in.Kind {
		case IntentAttach:
			if in.Count <= 0 {
				in.Count = count
			}
			reason = e.change(&in)
		case IntentResize, IntentRelease:
			reason = e.change(&in)
		case IntentMove:
			reason = e.move(&in)
		case IntentTune:
			reason = e.tune(&in)
		case IntentSetLimits:
			if in.Instance == "" {
				reason = "set_limits needs an instance"
			}
			in.Host = e.inst.Host
		}
		if reason != "" {
			r := Refusal{Intent: in, Reason: reason}
			for _, q := range e.quotaWhy {
				if strings.Contains(reason, q) {
					r.Code = RefusalQuota
				}
			}
			d.Refused = append(d.Refused, r)
			continue
		}
		d.Intents = append(d.Intents, in)
	}
	if len(rejects) > 0 {
		d.Rejected = true
		d.Reason = rejects[0].Message
		d.Intents = append(d.Intents, rejects[0])
		for _, r := range rejects[1:] {
			d.Refused = append(d.Refused, Refusal{Intent: r, Reason: "an earlier reject already decided"})
		}
	}
}

// change checks and completes an attach, resize or release intent; it
// returns why it is refused, or "".
func (e *evaluation) change(in *Intent) string {
	if e.inst.UUID == "" {
		return "the event names no instance"
	}
	in.Host = e.inst.Host
	if in.Kind == IntentRelease {
		if e.vmCount == 0 {
			return "the instance holds no vGPU"
		}
		if in.Profile == "" {
			in.Profile, in.Count = e.inst.Profile, e.vmCount
		} else {
			n := 0
			for _, v := range e.inst.VGPUs {
				if v.Profile == in.Profile {
					n += v.Count
				}
			}
			if n == 0 {
				return fmt.Sprintf("the instance holds no %s", in.Profile)
			}
			in.Count = n
		}
		if prof, ok := e.p.cat.ByName(in.Profile); ok {
			in.TypeID, in.Trait = prof.TypeID, prof.Trait
			e.usage.FramebufferMiB -= in.Count * prof.FramebufferMiB
		}
		e.usage.VGPUs -= in.Count
		e.vmCount -= in.Count
		for i, l := range e.limits {
			if l.Profile == "" || l.Profile == in.Profile {
				e.limits[i].Usage -= in.Count
			}
		}
		in.Mode, _ = e.p.attachMode(e.project.ID, in.Profile)
		return ""
	}
	if in.Profile == "" {
		if in.Kind == IntentResize {
			return "no target profile (larger()/smaller() found none?)"
		}
		if e.d.Preferred == "" {
			return "no profile: " + e.d.PreferredWhy
		}
		in.Profile = e.d.Preferred
	}
	prof, ok := e.p.cat.ByName(in.Profile)
	if !ok {
		return fmt.Sprintf("profile %q is not in the profile catalog", in.Profile)
	}
	in.Profile, in.TypeID, in.Trait = prof.Name, prof.TypeID, prof.Trait
	if in.Kind == IntentResize {
		if e.vmCount == 0 {
			return "the instance holds no vGPU to resize"
		}
		if in.Profile == e.inst.Profile {
			return fmt.Sprintf("the instance already has %s", in.Profile)
		}
		in.Count = e.vmCount
	}
	if why := e.quotaCheck(prof, in.Count, in.Kind == IntentResize); why != "" {
		return why
	}
	mode, modeWhy := e.p.attachMode(e.project.ID, prof.Name)
	in.Mode = mode
	if pref, ok := e.p.workload(e.project.ID, e.workload()); ok && pref.FrameRateLimit != nil {
		in.FrameRateLimit = pref.FrameRateLimit
	}
	if why := e.driverCheck(in, mode); why != "" {
		return why
	}
	in.Why += "; mode " + string(mode) + " (" + modeWhy + ")"
	for i, l := range e.limits {
		e.limits[i].Usage += e.limitDelta(l, prof, in.Count, in.Kind == IntentResize)
	}
	if in.Kind == IntentAttach {
		e.usage.VGPUs += in.Count
		e.usage.FramebufferMiB += in.Count * prof.FramebufferMiB
		e.vmCount += in.Count
	} else if cur, ok := e.p.cat.ByName(e.inst.Profile); ok {
		e.usage.FramebufferMiB += e.vmCount * (prof.FramebufferMiB - cur.FramebufferMiB)
	}
	return ""
}

// move completes a move intent: the GPU to leave is the one the event
// names (label gpu, as bridge.GPU_FAULT has). Which vGPUs go, and whether
// they can (a flavor's vGPU is Nova's), the planner decides from the
// instance's attachments; the profile and count do not change, so neither
// does the project's usage.
func (e *evaluation) move(in *Intent) string {
	if e.inst.UUID == "" {
		return "the event names no instance"
	}
	gpu := e.ev.Labels["gpu"]
	if gpu == "" {
		return "move() needs the GPU to leave: the event names none (label gpu, as bridge.GPU_FAULT has)"
	}
	if e.vmCount == 0 {
		return "the instance holds no vGPU to move"
	}
	in.Host, in.GPUs, in.Count = e.inst.Host, []string{gpu}, 0
	in.Mode = ModeDirectLive
	return ""
}

func (e *evaluation) workload() string {
	if e.ev.Workload != "" {
		return e.ev.Workload
	}
	return e.inst.Workload
}

// driverCheck excludes hosts whose vGPU manager cannot serve the guest's
// driver; it refuses when no host is left for the intent.
func (e *evaluation) driverCheck(in *Intent, mode AttachMode) string {
	if e.guest == "" || e.p.compat == nil {
		return ""
	}
	if mode != ModeNovaResize {
		// Direct paths attach on the instance's own host.
		if e.host.DriverVersion == "" {
			return ""
		}
		if !e.p.compat.Supported(e.host.Hypervisor, e.host.DriverVersion, e.guest) {
			return fmt.Sprintf("host %s: %s", e.host.Name, e.p.compat.Check(e.host.Hypervisor, e.host.DriverVersion, e.guest).Reason)
		}
		return ""
	}
	known := 0
	for _, h := range e.hosts {
		if h.DriverVersion == "" {
			continue
		}
		known++
		if !e.p.compat.Supported(h.Hypervisor, h.DriverVersion, e.guest) {
			in.ExcludedHosts = append(in.ExcludedHosts, Exclusion{Host: h.Name, Reason: e.p.compat.Check(h.Hypervisor, h.DriverVersion, e.guest).Reason})
		}
	}
	if known > 0 && len(in.ExcludedHosts) == known {
		return fmt.Sprintf("no host's vGPU manager supports guest driver %s (%s)", e.guest, in.ExcludedHosts[0].Reason)
	}
	return ""
}

// tune completes a tune intent and refuses one that conflicts with an
// earlier tune of the same GPUs in this decision.
func (e *evaluation) tune(in *Intent) string {
	in.Host = e.inst.Host
	seen := map[string]bool{}
	for _, v := range e.inst.VGPUs {
		if v.GPU != "" && !seen[v.GPU] {
			seen[v.GPU] = true
			in.GPUs = append(in.GPUs, v.GPU)
		}
	}
	sort.Strings(in.GPUs)
	if in.Host == "" || len(in.GPUs) == 0 {
		return "tune needs the instance's host and physical GPUs"
	}
	switch in.Scheduler {
	case "", "best_effort", "equal_share", "fixed_share":
	default:
		return fmt.Sprintf("unknown vGPU scheduler %q (want best_effort, equal_share or fixed_share)", in.Scheduler)
	}
	for _, o := range e.d.Intents {
		if o.Kind != IntentTune || o.Host != in.Host || !overlap(o.GPUs, in.GPUs) {
			continue
		}
		if o.Scheduler != in.Scheduler || o.TimesliceUS != in.TimesliceUS || o.ClocksMHz != in.ClocksMHz {
			return fmt.Sprintf("conflicts with rule %s's tuning of the same physical GPU (scheduler %s, timeslice %d µs, clocks %d MHz); tuning is shared by all tenants of a GPU", o.Rule, orNone(o.Scheduler), o.TimesliceUS, o.ClocksMHz)
		}
		return fmt.Sprintf("same tuning as rule %s", o.Rule)
	}
	return ""
}

func overlap(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// tuneRequest handles tuning asked for by the event's sender (a tenant,
// not an operator rule). Operator rules win: a request that differs from
// what they set in this decision is refused, one that agrees adds nothing.
// Otherwise the request becomes a tune intent marked Tenant; tuning is per
// physical GPU and shared by its tenants, so the bridge refuses it when
// another tenant's vGPU shares one of the instance's GPUs (it knows the
// projects; bridge/pipeline/sharedtune.go).
func (e *evaluation) tuneRequest() {
	t := e.ev.Tune
	if t == nil {
		return
	}
	req := Intent{Kind: IntentTune, Rule: "(request from " + orNone(e.ev.Source) + ")", Instance: e.inst.UUID, Host: e.inst.Host,
		Scheduler: t.Scheduler, TimesliceUS: t.TimesliceUS, ClocksMHz: t.ClocksMHz, Tenant: true,
		Why: fmt.Sprintf("the event's sender %s asked for it", orNone(e.ev.Source))}
	same := func(s string, ts, clk int) bool {
		return (t.Scheduler == "" || t.Scheduler == s) && (t.TimesliceUS == 0 || t.TimesliceUS == ts) && (t.ClocksMHz == 0 || t.ClocksMHz == clk)
	}
	for _, o := range e.d.Intents {
		if o.Kind == IntentTune {
			if same(o.Scheduler, o.TimesliceUS, o.ClocksMHz) {
				return
			}
			e.d.Refused = append(e.d.Refused, Refusal{Intent: req, Reason: fmt.Sprintf("conflicts with operator rule %s (scheduler %s, timeslice %d µs, clocks %d MHz): vGPU scheduling and clocks are per physical GPU and shared by its tenants; the operator's rules win", o.Rule, orNone(o.Scheduler), o.TimesliceUS, o.ClocksMHz)})
			return
		}
	}
	if len(e.inst.VGPUs) == 0 {
		e.d.Refused = append(e.d.Refused, Refusal{Intent: req, Reason: "the instance holds no vGPU, so no GPU to tune"})
		return
	}
	if t.Scheduler == "" && t.TimesliceUS == 0 && t.ClocksMHz == 0 {
		e.d.Refused = append(e.d.Refused, Refusal{Intent: req, Reason: "the request asks for no scheduler, timeslice or clocks"})
		return
	}
	if reason := e.tune(&req); reason != "" {
		e.d.Refused = append(e.d.Refused, Refusal{Intent: req, Reason: reason})
		return
	}
	// What the instance's GPUs have already (as their agent reports) is
	// no change.
	set := 0
	for _, g := range e.host.GPUs {
		if slices.Contains(req.GPUs, g.Address) && same(g.Scheduler, g.TimesliceUS, g.ClocksMHz) {
			set++
		}
	}
	if set == len(req.GPUs) {
		return
	}
	e.d.Intents = append(e.d.Intents, req)
}

// finish sets the rejection and load updates.
func (e *evaluation) finish() {
	d := e.d
	if !d.Rejected {
		changed, refusedChange, code := false, "", ""
		for _, in := range d.Intents {
			changed = changed || in.Kind.changes()
		}
		for _, r := range d.Refused {
			if r.Intent.Kind.changes() && refusedChange == "" {
				refusedChange, code = r.Reason, r.Code
			}
		}
		if !changed && refusedChange != "" {
			d.Rejected, d.Reason, d.Code = true, refusedChange, code
		}
	}
	for _, in := range d.Intents {
		if in.Kind.changes() && in.Instance != "" {
			d.LoadUpdates = append(d.LoadUpdates, LoadUpdate{Op: LoadChange, Instance: in.Instance, At: e.now})
			break
		}
	}
}
