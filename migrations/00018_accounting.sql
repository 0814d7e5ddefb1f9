-- vGPU accounting and the bridge's own notifications (doc/source/accounting.rst).
-- +goose Up

-- Usage intervals: one row per vGPU held, from when it was attached (or
-- the instance's flavor gave it one on a host) to when it went. A direct
-- attachment has one row (attachment_id); a flavor's vGPUs one row per
-- request group and stretch of the instance's life on one host with one
-- flavor. Written by the request lifecycle, in the transaction of the
-- change it accounts, so a rolled-back change accounts nothing.
CREATE TABLE vgpu_usage (
    id              bigserial PRIMARY KEY,
    path            text NOT NULL CHECK (path IN ('direct', 'flavor')),
    attachment_id   uuid UNIQUE,            -- direct: vgpu_attachments.id
    instance_uuid   uuid NOT NULL,
    project_id      text,
    user_id         text,
    host            text,
    profile         text,                   -- e.g. T4-4Q; '' for an untyped flavor group
    vgpu_type       text,                   -- e.g. nvidia-232, where known
    resource_class  text NOT NULL DEFAULT 'VGPU',
    amount          integer NOT NULL DEFAULT 1,
    flavor          text,                   -- flavor: the flavor's name
    started_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    CHECK (ended_at IS NULL OR ended_at >= started_at),
    CHECK ((path = 'direct') = (attachment_id IS NOT NULL))
);
CREATE INDEX vgpu_usage_open_idx ON vgpu_usage (instance_uuid) WHERE ended_at IS NULL;
CREATE INDEX vgpu_usage_time_idx ON vgpu_usage (started_at, ended_at);
CREATE INDEX vgpu_usage_project_idx ON vgpu_usage (project_id, started_at);

-- Closed audit periods ([accounting] audit_period), like Nova's
-- instance.exists: each interval's seconds within the period, frozen when
-- the period ended, and one vgpu.exists notification per row.
CREATE TABLE vgpu_usage_periods (
    period_start    timestamptz PRIMARY KEY,
    period_end      timestamptz NOT NULL,
    closed_at       timestamptz NOT NULL DEFAULT now(),
    closed_by       text,
    rows            integer NOT NULL DEFAULT 0,
    CHECK (period_end > period_start)
);
CREATE TABLE vgpu_usage_exists (
    period_start    timestamptz NOT NULL REFERENCES vgpu_usage_periods ON DELETE CASCADE,
    usage_id        bigint NOT NULL,
    instance_uuid   uuid NOT NULL,
    project_id      text,
    path            text NOT NULL,
    host            text,
    profile         text,
    vgpu_type       text,
    resource_class  text NOT NULL,
    amount          integer NOT NULL,
    seconds         bigint NOT NULL,
    PRIMARY KEY (period_start, usage_id)
);
CREATE INDEX vgpu_usage_exists_project_idx ON vgpu_usage_exists (project_id, period_start);

-- The bridge's own notifications, oslo.messaging's versioned format:
-- queued in the transaction of the change they report, published by one
-- replica in id order once committed (bridge/notify).
CREATE TABLE bridge_notifications (
    id              bigserial PRIMARY KEY,
    message_id      uuid NOT NULL DEFAULT gen_random_uuid(),
    event_type      text NOT NULL,
    priority        text NOT NULL DEFAULT 'INFO' CHECK (priority IN ('INFO', 'WARN', 'ERROR')),
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_at         timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text
);
CREATE INDEX bridge_notifications_unsent_idx ON bridge_notifications (id) WHERE sent_at IS NULL;
CREATE INDEX bridge_notifications_created_idx ON bridge_notifications (created_at);
