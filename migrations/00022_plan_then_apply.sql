-- Plan, then claim, then apply: a decision that needs Placement claims
-- commits what it plans to claim before it claims, with no transaction
-- open while Placement is called, and records the claims in a second
-- transaction; the policy is evaluated once.
-- +goose Up

-- The vGPUs a decision planned and has not yet recorded as attachments:
-- they count in the project's usage (so two decisions of one project
-- cannot both pass its quota across the claim) until the transaction that
-- records the claim's attachments deletes them. A row left by a crash is
-- replaced when the event is decided again, and goes when the event is
-- closed otherwise (given up on) or purged.
CREATE TABLE planned_claims (
    id            bigserial PRIMARY KEY,
    event_id      bigint NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    request_id    uuid,
    instance_uuid uuid NOT NULL,
    profile       text NOT NULL DEFAULT '',
    units         integer NOT NULL CHECK (units > 0),
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX planned_claims_event_idx ON planned_claims (event_id);
CREATE INDEX planned_claims_instance_idx ON planned_claims (instance_uuid);
