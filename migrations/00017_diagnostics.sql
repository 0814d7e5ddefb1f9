-- Diagnostics bundles (doc/source/troubleshooting.rst): an operator's request for a host's
-- evidence (vgpuctl diagnose HOST), the collect_diagnostics command it
-- queued (commands.id, no request), and the tar.gz the agent sent back.
-- Purged after [retention] diagnostics.
-- +goose Up
CREATE TABLE diagnostics (
    id              uuid PRIMARY KEY,
    command_id      uuid NOT NULL UNIQUE,
    host            text NOT NULL,
    instance_uuid   uuid,
    requested_by    text NOT NULL,
    request_id      text,
    requested_at    timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    completed_at    timestamptz,
    status          text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'complete', 'failed')),
    error           text,
    size            bigint,
    sha256          text,
    manifest        jsonb,
    bundle          bytea
);
CREATE INDEX diagnostics_requested_idx ON diagnostics (requested_at);
CREATE INDEX diagnostics_pending_idx ON diagnostics (expires_at) WHERE status = 'pending';
