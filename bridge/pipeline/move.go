package pipeline

// MoveEvents are the Nova notifications that end a move of an instance:
// a resize or cold migration (finished, confirmed or reverted), a live
// migration, an evacuation (a rebuild on another host), a shelve offload
// and an unshelve. Nova rewrites the instance's Placement allocations on
// each, dropping the direct-path vGPUs the bridge added to its consumer,
// and the domain on the new host has no mdev of the bridge's.
var MoveEvents = []string{
	"instance.resize_finish.end",
	"instance.resize_confirm.end",
	"instance.resize_revert.end",
	"instance.live_migration_post.end",
	"instance.rebuild.end", // evacuate: rebuilt on another host (on the same host: RebuildEvents)
	"instance.shelve_offload.end",
	"instance.unshelve.end",
}

// IsMove reports whether kind (NovaKindPrefix and the event type) is
// one of MoveEvents.
func IsMove(kind string) bool {
	for _, k := range MoveEvents {
		if kind == NovaKindPrefix+k {
			return true
		}
	}
	return false
}
