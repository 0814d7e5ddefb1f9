package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// CheckResult is how one upgrade check came out, as nova-status says it.
type CheckResult int

// Results, worst last; the command exits with the worst one's code.
const (
	CheckSuccess CheckResult = iota // exit 0
	CheckWarning                    // exit 1: works, but look
	CheckFailure                    // exit 2: fix before serving
)

func (r CheckResult) String() string {
	return [...]string{"Success", "Warning", "Failure"}[r]
}

// Check is one line of `vgpu-bridge upgrade check`.
type Check struct {
	Name    string
	Result  CheckResult
	Details string
}

// UpgradeCheck checks what a bridge of this release needs of the
// deployment it is about to serve: the schema, Nova's notifications,
// Placement's microversion, typed GPU providers, the agents' protocol and
// the keys. It reads the database and asks Placement; it changes nothing.
// err is for a check that could not run at all (no database).
func UpgradeCheck(ctx context.Context, v *conf.Values) ([]Check, error) {
	sc, err := StoreConfig(v)
	if err != nil {
		return nil, err
	}
	pool, err := store.Open(ctx, sc)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// The pool connects lazily: without this, a database that cannot be
	// reached would come out as failed checks (exit 2), not as checks
	// that could not run (255).
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("cannot reach the database: %w", err)
	}
	checks := []Check{checkSchemaCurrent(ctx, pool), checkNotifications(ctx, pool), checkPlacement(ctx, v)}
	pc := placement.ConfigFrom(v)
	checks = append(checks, checkProviders(ctx, pool, pc.Classes, pc.TypePrefix))
	checks = append(checks, checkAgents(ctx, pool, pc.StaleReportAge), checkKeys(v))
	return checks, nil
}

func checkSchemaCurrent(ctx context.Context, pool *pgxpool.Pool) Check {
	c := Check{Name: "Database schema"}
	n, err := store.Pending(ctx, pool)
	switch {
	case err != nil:
		c.Result, c.Details = CheckFailure, err.Error()
	case n > 0:
		c.Result, c.Details = CheckFailure, fmt.Sprintf("%d migration(s) pending: run vgpu-bridge migrate up", n)
	}
	return c
}

func checkNotifications(ctx context.Context, pool *pgxpool.Pool) Check {
	c := Check{Name: "Nova versioned notifications"}
	var last *time.Time
	if err := pool.QueryRow(ctx, `SELECT max(received_at) FROM events WHERE source = 'nova'`).Scan(&last); err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	if last == nil {
		c.Result, c.Details = CheckWarning, "none received yet: Nova sends them with nova.conf [notifications] "+
			"notification_format = versioned (or both) and [oslo_messaging_notifications] driver = messagingv2"
		return c
	}
	c.Details = "last received " + last.UTC().Format(time.RFC3339)
	return c
}

func checkPlacement(ctx context.Context, v *conf.Values) Check {
	c := Check{Name: "Placement API"}
	pc, err := PlacementConfig(v, "upgrade-check")
	if err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	want := pc.Client.Microversion
	if want == "" {
		want = placement.DefaultMicroversion
	}
	cl, err := placement.NewClient(ctx, pc.Client)
	if err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	sc := cl.ServiceClient()
	var doc struct {
		Versions []struct {
			ID         string `json:"id"`
			MaxVersion string `json:"max_version"`
		} `json:"versions"`
	}
	root := strings.TrimSuffix(sc.ResourceBaseURL(), "/") + "/"
	if _, err := sc.Get(ctx, root, &doc, nil); err != nil {
		c.Result, c.Details = CheckFailure, fmt.Sprintf("GET %s: %v", root, err)
		return c
	}
	if len(doc.Versions) == 0 {
		c.Result, c.Details = CheckFailure, "Placement's version document names no version"
		return c
	}
	maxV := doc.Versions[0].MaxVersion
	if !microversionAtLeast(maxV, want) {
		c.Result, c.Details = CheckFailure, fmt.Sprintf("Placement's newest microversion is %s; this bridge speaks %s "+
			"([placement] microversion): upgrade Placement", maxV, want)
		return c
	}
	c.Details = fmt.Sprintf("microversion %s of up to %s", want, maxV)
	return c
}

// microversionAtLeast compares "1.39"-style microversions.
func microversionAtLeast(have, want string) bool {
	parse := func(s string) (int, int, bool) {
		a, b, ok := strings.Cut(s, ".")
		x, e1 := strconv.Atoi(a)
		y, e2 := strconv.Atoi(b)
		return x, y, ok && e1 == nil && e2 == nil
	}
	hx, hy, ok1 := parse(have)
	wx, wy, ok2 := parse(want)
	return ok1 && ok2 && (hx > wx || (hx == wx && hy >= wy))
}

// checkProviders finds GPU providers (vGPU inventory, in the mirror of
// the last sync) without a type trait, which stock Nova does not set. One
// whose agent's report fixes its type is a warning (the bridge learns the
// type from it); one whose type nothing says fails.
func checkProviders(ctx context.Context, pool *pgxpool.Pool, classes []string, prefix string) Check {
	c := Check{Name: "GPU providers typed"}
	rows, err := pool.Query(ctx, `SELECT p.name, coalesce(root.name, '') FROM placement_providers p
			LEFT JOIN placement_providers root ON root.uuid = p.root_uuid
		WHERE EXISTS (SELECT 1 FROM placement_inventories i WHERE i.provider_uuid = p.uuid AND i.resource_class = ANY($1))
		  AND NOT EXISTS (SELECT 1 FROM placement_traits t WHERE t.provider_uuid = p.uuid AND starts_with(t.trait, $2))
		ORDER BY p.name`, classes, prefix)
	if err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	type untyped struct{ name, node string }
	var list []untyped
	for rows.Next() {
		var u untyped
		if err := rows.Scan(&u.name, &u.node); err != nil {
			rows.Close()
			c.Result, c.Details = CheckFailure, err.Error()
			return c
		}
		list = append(list, u)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	var total int
	_ = pool.QueryRow(ctx, `SELECT count(DISTINCT provider_uuid) FROM placement_inventories WHERE resource_class = ANY($1)`, classes).Scan(&total)
	if len(list) == 0 {
		c.Details = fmt.Sprintf("%d GPU provider(s), each with a %s* trait (as of the last Placement sync)", total, prefix)
		return c
	}
	reported, err := reportedGPUs(ctx, pool)
	if err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	var orphans, known []string
	for _, u := range list {
		if reported[u.name] {
			known = append(known, u.name)
		} else {
			orphans = append(orphans, u.name)
		}
	}
	var parts []string
	if len(orphans) > 0 {
		c.Result = CheckFailure
		parts = append(parts, fmt.Sprintf("without a %s* trait and reported by no agent: %s (add the trait of its vGPU type, "+
			"e.g. openstack resource provider trait set --trait %sNVIDIA_232 UUID, or run an agent on its host)",
			prefix, strings.Join(orphans, ", "), "CUSTOM_"))
	}
	if len(known) > 0 {
		c.Result = max(c.Result, CheckWarning)
		parts = append(parts, fmt.Sprintf("without a %s* trait, typed from their agents' reports (the direct path places on "+
			"them; Nova's scheduler needs the trait): %s", prefix, strings.Join(known, ", ")))
	}
	c.Details = strings.Join(parts, "; ")
	return c
}

// reportedGPUs are the GPU provider names whose type the agents'
// reports fix (placement.ReportedTypes), as the bridge learns them.
func reportedGPUs(ctx context.Context, pool *pgxpool.Pool) (map[string]bool, error) {
	rows, err := pool.Query(ctx, `SELECT coalesce(node, name), report FROM hosts WHERE report IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var node string
		var raw []byte
		if err := rows.Scan(&node, &raw); err != nil {
			return nil, err
		}
		var r protocol.Report
		if json.Unmarshal(raw, &r) != nil {
			continue
		}
		if r.Node != "" {
			node = r.Node
		}
		for name := range placement.ReportedTypes(node, r) {
			out[name] = true
		}
	}
	return out, rows.Err()
}

// checkAgents reads each host's last report: its protocol minor (this
// bridge writes the minor before to agents not yet upgraded) and its age.
func checkAgents(ctx context.Context, pool *pgxpool.Pool, staleAge time.Duration) Check {
	c := Check{Name: "Agents' protocol"}
	rows, err := pool.Query(ctx, `SELECT name, coalesce((report->>'v')::int, 0), coalesce((report->>'minor')::int, 0),
			coalesce(agent_version, ''), last_report_at FROM hosts WHERE report IS NOT NULL ORDER BY name`)
	if err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	defer rows.Close()
	var n int
	var refused, older, stale []string
	for rows.Next() {
		var name, ver string
		var major, minor int
		var at *time.Time
		if err := rows.Scan(&name, &major, &minor, &ver, &at); err != nil {
			c.Result, c.Details = CheckFailure, err.Error()
			return c
		}
		n++
		switch {
		case major != protocol.Version || !protocol.AcceptedMinor(minor):
			refused = append(refused, fmt.Sprintf("%s (%d.%d, agent %s)", name, major, minor, ver))
		case minor < protocol.Minor:
			older = append(older, fmt.Sprintf("%s (agent %s)", name, ver))
		}
		if at == nil || time.Since(*at) > staleAge {
			stale = append(stale, name)
		}
	}
	if err := rows.Err(); err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	if n == 0 {
		c.Result, c.Details = CheckWarning, "no agent has reported yet"
		return c
	}
	sort.Strings(stale)
	var parts []string
	if len(refused) > 0 {
		c.Result = CheckFailure
		parts = append(parts, fmt.Sprintf("speak a protocol this bridge (%d.%d) cannot read: %s", protocol.Version, protocol.Minor,
			strings.Join(refused, ", ")))
	}
	if len(older) > 0 {
		c.Result = max(c.Result, CheckWarning)
		parts = append(parts, fmt.Sprintf("on protocol %d.%d, served at it until upgraded: %s", protocol.Version, protocol.Minor-1,
			strings.Join(older, ", ")))
	}
	if len(stale) > 0 {
		c.Result = max(c.Result, CheckWarning)
		parts = append(parts, fmt.Sprintf("no report for over %s: %s", staleAge, strings.Join(stale, ", ")))
	}
	if len(parts) == 0 {
		parts = append(parts, fmt.Sprintf("%d agent(s) on protocol %d.%d", n, protocol.Version, protocol.Minor))
	}
	c.Details = strings.Join(parts, "; ")
	return c
}

// checkKeys loads the [security] key files as serve would.
func checkKeys(v *conf.Values) Check {
	c := Check{Name: "Signing keys"}
	var dc dispatch.Config
	if err := SecurityConfig(v, &dc, nil); err != nil {
		c.Result, c.Details = CheckFailure, err.Error()
		return c
	}
	switch {
	case dc.Signer == nil || !dc.RequireSigned:
		c.Result, c.Details = CheckWarning, "commands unsigned or unsigned results accepted ([security] opt-outs set)"
	case dc.Keyring != nil:
		c.Details = fmt.Sprintf("signing key and %d trusted key(s)", dc.Keyring.Len())
	}
	return c
}
