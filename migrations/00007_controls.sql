-- Operator controls: global pause and observe-only mode, host and
-- GPU drains, Nova compute services marked disabled, the request ids of
-- audit rows, and what retention purges by.
-- +goose Up

-- One row: the switches every replica obeys. The pipeline and the outbox
-- relay read them in their own transactions under a shared advisory lock
-- that a change takes exclusively, so once a change has committed no
-- decision or send made under the old mode is still in flight.
CREATE TABLE bridge_controls (
    id              int PRIMARY KEY CHECK (id = 1),
    paused          boolean NOT NULL DEFAULT false,   -- no decisions, nothing sent
    observe_only    boolean NOT NULL DEFAULT false,   -- decide and explain, act on nothing
    reason          text,
    actor           text,
    request_id      text,                             -- X-OpenStack-Request-ID of the change
    paused_at       timestamptz,
    observe_since   timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO bridge_controls (id) VALUES (1);

-- Drains (operators) and Nova's service state (service.create/update/delete
-- of nova-compute). hosts.drained and hosts.disabled (00001) keep their
-- meaning: either one excludes the host from placement.
ALTER TABLE hosts
    ADD COLUMN drain_reason        text,
    ADD COLUMN drained_by          text,
    ADD COLUMN drained_at          timestamptz,
    ADD COLUMN forced_down         boolean NOT NULL DEFAULT false,
    ADD COLUMN disabled_reason     text,
    ADD COLUMN service_event_at    timestamptz;  -- timestamp of the newest service notification applied
ALTER TABLE gpus
    ADD COLUMN drain_reason        text,
    ADD COLUMN drained_by          text,
    ADD COLUMN drained_at          timestamptz;

-- Audit rows carry the OpenStack request id they were made under. Writers
-- that do not name it inherit the transaction's vgpu.global_request_id
-- setting (set_config(..., true)), which the pipeline and the API set.
ALTER TABLE audit_log
    ADD COLUMN global_request_id text DEFAULT nullif(current_setting('vgpu.global_request_id', true), '');
CREATE INDEX audit_log_at_idx ON audit_log (at);

-- Retention purges by age.
CREATE INDEX events_received_idx ON events (received_at) WHERE processed_at IS NOT NULL;
CREATE INDEX requests_finished_idx ON requests (finished_at) WHERE finished_at IS NOT NULL;

-- Every replica refreshes its placement exclusions when a drain or a
-- service state really changes, whoever wrote it (agents' reports, which
-- touch neither column, stay quiet).
-- +goose StatementBegin
CREATE FUNCTION vgpu_controls_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vgpu_controls', TG_TABLE_NAME);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER hosts_controls_insert AFTER INSERT ON hosts
    FOR EACH ROW WHEN (NEW.drained OR NEW.disabled) EXECUTE FUNCTION vgpu_controls_notify();
CREATE TRIGGER hosts_controls_update AFTER UPDATE OF drained, disabled ON hosts
    FOR EACH ROW WHEN (OLD.drained IS DISTINCT FROM NEW.drained OR OLD.disabled IS DISTINCT FROM NEW.disabled)
    EXECUTE FUNCTION vgpu_controls_notify();
CREATE TRIGGER gpus_controls_update AFTER UPDATE OF drained ON gpus
    FOR EACH ROW WHEN (OLD.drained IS DISTINCT FROM NEW.drained) EXECUTE FUNCTION vgpu_controls_notify();
CREATE TRIGGER bridge_controls_notify AFTER UPDATE ON bridge_controls
    FOR EACH STATEMENT EXECUTE FUNCTION vgpu_controls_notify();

-- Dead-letter replay: what became of a replayed letter (kept, not deleted).
ALTER TABLE dead_letters
    ADD COLUMN replayed_at      timestamptz,
    ADD COLUMN replayed_by      text,
    ADD COLUMN replay_event_id  bigint;
