-- Nova ingest: what the notification consumer keeps beyond the
-- foundation's instances / events / dead_letters.
-- +goose Up

-- Instance state, out-of-order safe: an event applies only when
-- (occurred_at, phase rank) is newer than (last_event_at, last_event_rank).
ALTER TABLE instances
    ADD COLUMN display_name       text,
    ADD COLUMN availability_zone  text,
    ADD COLUMN new_flavor         jsonb,            -- target flavor of a resize in progress
    ADD COLUMN vgpus              integer NOT NULL DEFAULT 0,  -- VGPU + CUSTOM_* units of the flavor
    ADD COLUMN fault              jsonb,            -- last fault (ExceptionPayload) of an .error event
    ADD COLUMN last_event_rank    smallint NOT NULL DEFAULT 0, -- nova.Phase.Rank of last_event_type
    ADD COLUMN last_message_id    text;
CREATE INDEX instances_vgpu_idx ON instances (uuid) WHERE vgpus > 0;
-- Instances are updated on every event: leave room for HOT updates.
ALTER TABLE instances SET (fillfactor = 80);

-- Inbox: the notification's envelope facts next to the payload.
ALTER TABLE events
    ADD COLUMN publisher_id       text,
    ADD COLUMN priority           text,
    ADD COLUMN request_id         text,
    ADD COLUMN global_request_id  text,
    ADD COLUMN project_id         text,
    ADD COLUMN user_id            text,
    -- NULL: accepted; 'unrecognized': unknown major version or event type,
    -- kept for the record and not applied.
    ADD COLUMN status             text,
    ADD COLUMN detail             text;
-- No further index on events: every index costs each insert, and the inbox
-- takes thousands of rows a second. The API's filters ride on the primary
-- key and events_instance_idx.

ALTER TABLE dead_letters
    ADD COLUMN detail             text,
    ADD COLUMN message_id         text;
CREATE INDEX dead_letters_received_idx ON dead_letters (received_at);

-- Flavors as flavor.create/update/delete notifications describe them, with
-- their parsed vGPU demand.
CREATE TABLE flavors (
    flavorid        text PRIMARY KEY,
    name            text,
    vcpus           integer,
    memory_mb       integer,
    is_public       boolean,
    extra_specs     jsonb,
    vgpu_demand     jsonb,
    vgpus           integer NOT NULL DEFAULT 0,
    spec_error      text,                   -- why extra_specs could not be parsed
    last_event_at   timestamptz,
    deleted_at      timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Payloads are 2-4 KB of JSON: lz4 compresses them far cheaper than the
-- default pglz (kept where the server lacks lz4).
-- +goose StatementBegin
DO $$
BEGIN
    ALTER TABLE events ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; events.payload keeps the default compression';
END
$$;
-- +goose StatementEnd
