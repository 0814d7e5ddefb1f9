package nova

// knownEvents are the versioned notification event types Nova emits, from
// doc/notification_samples (plus the instance.* actions without a sample).
var knownEvents = map[string]bool{}

func init() {
	for _, e := range []string{
		"aggregate.add_host", "aggregate.cache_images", "aggregate.create", "aggregate.delete",
		"aggregate.remove_host", "aggregate.update_metadata", "aggregate.update_prop",
		"compute.exception",
		"compute_task.build_instances", "compute_task.migrate_server", "compute_task.rebuild_server",
		"flavor.create", "flavor.delete", "flavor.update",
		"instance.create", "instance.delete", "instance.evacuate", "instance.exists",
		"instance.interface_attach", "instance.interface_detach",
		"instance.live_migration_abort", "instance.live_migration_force_complete",
		"instance.live_migration_post", "instance.live_migration_post_dest",
		"instance.live_migration_pre", "instance.live_migration_rollback",
		"instance.live_migration_rollback_dest", "instance.lock", "instance.unlock",
		"instance.pause", "instance.unpause", "instance.power_off", "instance.power_on",
		"instance.power_on_share", "instance.reboot", "instance.rebuild", "instance.rebuild_scheduled",
		"instance.rescue", "instance.unrescue", "instance.resize", "instance.resize_confirm",
		"instance.resize_finish", "instance.resize_prep", "instance.resize_revert",
		"instance.restore", "instance.resume", "instance.suspend",
		"instance.share_attach", "instance.share_detach",
		"instance.shelve", "instance.shelve_offload", "instance.unshelve",
		"instance.shutdown", "instance.snapshot", "instance.soft_delete",
		"instance.trigger_crash_dump", "instance.update",
		"instance.volume_attach", "instance.volume_detach", "instance.volume_swap",
		"keypair.create", "keypair.delete", "keypair.import",
		"libvirt.connect", "metrics.update",
		"scheduler.select_destinations",
		"server_group.add_member", "server_group.create", "server_group.delete",
		"service.create", "service.delete", "service.update",
		"volume.usage",
	} {
		knownEvents[e] = true
	}
}

// KnownEvent reports whether the event type (without its phase) is one
// Nova is known to emit. An unknown one is recorded, not applied blindly.
func (e EventType) KnownEvent() bool {
	return knownEvents[e.Object+"."+e.Action]
}
