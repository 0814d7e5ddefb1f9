-- Re-types of Nova-owned mdev GPUs (vgpuctl fleet retype) run as fleet
-- upgrades of kind 'retype' (package bridge/fleetupgrade): each host goes
-- pending → draining → upgrading (the agent's gpu_retype_command, with
-- the nova.conf change) → verifying (the GPU providers' new type trait in
-- Placement) → undraining → done, or failed (the host stays drained).
-- retype is the host's change (placement/novaconf.Change: the GPUs, their
-- providers and traits, the nova.conf text) fixed when the run started.
-- +goose Up
ALTER TABLE fleet_upgrades ADD COLUMN kind text NOT NULL DEFAULT 'upgrade' CHECK (kind IN ('upgrade', 'retype'));
ALTER TABLE fleet_upgrade_hosts ADD COLUMN retype jsonb;
