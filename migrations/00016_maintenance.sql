-- Host maintenance (doc/source/operations.rst): operations that move every vGPU VM off a
-- host (vgpuctl host migrate-all), and each VM's progress, durable so that
-- a bridge restarted mid-operation resumes or fails each VM cleanly.
-- +goose Up
CREATE TABLE maintenance_operations (
    id              uuid PRIMARY KEY,
    host            text NOT NULL,
    state           text NOT NULL DEFAULT 'running'
        CHECK (state IN ('running','succeeded','failed')),
    options         jsonb NOT NULL,             -- maintenance.Options
    drained_by_op   boolean NOT NULL DEFAULT false, -- the operation drained the host: it undrains it
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
-- One running operation per host.
CREATE UNIQUE INDEX maintenance_operations_running_idx ON maintenance_operations (host) WHERE state = 'running';

CREATE TABLE maintenance_vms (
    operation_id    uuid NOT NULL REFERENCES maintenance_operations (id) ON DELETE CASCADE,
    instance_uuid   uuid NOT NULL,
    seq             int NOT NULL,               -- plan order
    name            text,
    path            text,                       -- nova, direct
    action          text NOT NULL,              -- cold_migrate, live_migrate, move_direct, skip
    target          text,
    state           text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending','detaching','migrating','confirming','attaching','done','failed')),
    reason          text,
    steps           jsonb NOT NULL DEFAULT '[]', -- maintenance.Step list
    -- The bridge's reservation consumer in Placement (direct path),
    -- recorded before it is written there, and Nova's migration (its
    -- Placement consumer while the move runs).
    reservation_consumer uuid,
    migration_uuid  uuid,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, instance_uuid)
);
CREATE INDEX maintenance_vms_reservation_idx ON maintenance_vms (reservation_consumer) WHERE reservation_consumer IS NOT NULL;
CREATE INDEX maintenance_vms_migration_idx ON maintenance_vms (migration_uuid) WHERE migration_uuid IS NOT NULL;
