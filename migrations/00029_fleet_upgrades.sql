-- Rolling vGPU-manager upgrades (vgpuctl fleet upgrade, package
-- bridge/fleetupgrade): one operation per run, one row per host. Each
-- host goes pending → draining → evacuating → upgrading → verifying →
-- gating → undraining → done (or failed, with the error), each step
-- recorded (and audited) before the next starts, with the ids of what it
-- started (the maintenance operation, the agent's commands) so that a
-- bridge restarted in the middle resumes the step where it was.
-- +goose Up
CREATE TABLE fleet_upgrades (
    id              uuid PRIMARY KEY,
    branch          text NOT NULL,
    version         text,
    max_unavailable integer NOT NULL CHECK (max_unavailable >= 1),
    stop_on_failure boolean NOT NULL DEFAULT true,
    state           text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed')),
    error           text,
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX fleet_upgrades_running_idx ON fleet_upgrades (created_at) WHERE state = 'running';

CREATE TABLE fleet_upgrade_hosts (
    upgrade_id      uuid NOT NULL REFERENCES fleet_upgrades (id) ON DELETE CASCADE,
    host            text NOT NULL,
    seq             integer NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'draining', 'evacuating', 'upgrading',
                        'verifying', 'gating', 'undraining', 'done', 'failed')),
    from_driver     text,
    to_driver       text,
    drained_by_op   boolean NOT NULL DEFAULT false,
    maintenance_id  uuid,
    upgrade_command uuid,
    gate_command    uuid,
    output          text,
    error           text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (upgrade_id, host)
);
-- A host is in one running upgrade at most.
CREATE UNIQUE INDEX fleet_upgrade_hosts_active_idx ON fleet_upgrade_hosts (host)
    WHERE state NOT IN ('pending', 'done', 'failed');
