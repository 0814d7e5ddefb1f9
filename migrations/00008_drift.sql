-- Drift reconciler and Nova moves: what the reconciler found when it compared Placement's
-- allocations, the agents' reports and the bridge's own records, and its
-- runs.
-- +goose Up

-- One row per difference while it lasts: a finding seen again updates
-- last_seen; one no longer seen gets resolved_at. fingerprint names the
-- difference (kind, host, GPU, instance, mdev): at most one open row each.
CREATE TABLE drift_findings (
    id                  bigserial PRIMARY KEY,
    kind                text NOT NULL
        CHECK (kind IN ('orphan_mdev','missing_device','stale_claim','unclaimed_device','unknown_instance')),
    fingerprint         text NOT NULL,
    host                text,
    provider_uuid       uuid,               -- GPU child provider
    pci_address         text,
    instance_uuid       uuid,
    mdev_uuid           uuid,
    detail              text NOT NULL,
    repairable          boolean NOT NULL DEFAULT false,
    repaired            boolean NOT NULL DEFAULT false,
    repair              text,               -- what the reconciler did about it
    repair_request_id   uuid,               -- the request whose commands repair it
    repaired_at         timestamptz,
    first_seen          timestamptz NOT NULL DEFAULT now(),
    last_seen           timestamptz NOT NULL DEFAULT now(),
    seen                integer NOT NULL DEFAULT 1,   -- runs that found it
    resolved_at         timestamptz
);
CREATE UNIQUE INDEX drift_findings_open_idx ON drift_findings (fingerprint) WHERE resolved_at IS NULL;
CREATE INDEX drift_findings_last_seen_idx ON drift_findings (last_seen);

CREATE TABLE drift_runs (
    id              bigserial PRIMARY KEY,
    replica         text,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL DEFAULT now(),
    findings        integer NOT NULL DEFAULT 0,     -- open after the run
    new_findings    integer NOT NULL DEFAULT 0,
    resolved        integer NOT NULL DEFAULT 0,
    repairs         integer NOT NULL DEFAULT 0,
    skipped_hosts   text[],                          -- hosts whose reports were too old to judge
    error           text
);

-- Direct-path vGPUs released by a shelve offload, applied again on the
-- host Nova picks at the unshelve (bridge/pipeline/move.go).
ALTER TABLE vgpu_attachments
    ADD COLUMN shelved boolean NOT NULL DEFAULT false;
