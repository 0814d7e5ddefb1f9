package ingest

import (
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// upsertService keeps Nova's view of a compute service on its hosts row:
// a service disabled, forced down or deleted excludes the host from
// placement (hosts.disabled) until a newer notification enables it.
//
// A host no agent reported yet takes its node (the Placement root provider
// name, which the exclusion needs) from the instances Nova placed there.
const upsertService = `INSERT INTO hosts AS h (name, node, disabled, forced_down, disabled_reason, service_event_at)
	VALUES ($1, (SELECT node FROM instances WHERE host = $1 AND node IS NOT NULL LIMIT 1), $2, $3, nullif($4, ''), $5)
	ON CONFLICT (name) DO UPDATE SET node = coalesce(h.node, EXCLUDED.node), disabled = EXCLUDED.disabled, forced_down = EXCLUDED.forced_down,
		disabled_reason = EXCLUDED.disabled_reason, service_event_at = EXCLUDED.service_event_at, updated_at = now()
	WHERE h.service_event_at IS NULL OR h.service_event_at <= EXCLUDED.service_event_at`

// queueService queues the hosts update of a nova-compute service
// notification (service.create, service.update, service.delete); other
// binaries change nothing.
func queueService(b *pgx.Batch, m *nova.Message, p *nova.ServiceStatus, at time.Time) bool {
	if p.Binary != "nova-compute" || p.Host == "" {
		return false
	}
	reason := ""
	if p.DisabledReason != nil {
		reason = *p.DisabledReason
	}
	disabled := p.Disabled || p.ForcedDown
	switch {
	case m.EventType == "service.delete":
		disabled, reason = true, "the nova-compute service was deleted"
	case p.ForcedDown && reason == "":
		reason = "the nova-compute service is forced down"
	case !disabled:
		reason = ""
	}
	b.Queue(upsertService, p.Host, disabled, p.ForcedDown, reason, at)
	return true
}
