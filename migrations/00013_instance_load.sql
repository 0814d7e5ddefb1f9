-- The load of each instance's vGPUs as its host's agent reports it (NVML's
-- SM utilisation and framebuffer in use), a window of samples per
-- instance: the load evaluator turns it into bridge.vgpu_load events, so
-- load rules run without an outside monitor.
-- +goose Up

CREATE TABLE instance_load (
    instance_uuid   uuid PRIMARY KEY,
    host            text NOT NULL,
    -- [[unix seconds, SM util %, framebuffer used MiB], ...], oldest first;
    -- samples older than two hours are dropped as new ones come.
    samples         jsonb NOT NULL DEFAULT '[]',
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX instance_load_updated_idx ON instance_load (updated_at);
