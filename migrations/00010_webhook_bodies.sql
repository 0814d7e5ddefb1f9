-- Bodies signed with X-Hub-Signature-256, per source, kept as long as the
-- idempotency keys (webhooks ttl). That MAC covers the body alone: a
-- captured request replayed under another key, or none, would act again.
-- A body acts once; a replay is refused (409 replayed) while its digest
-- is kept.
-- +goose Up

CREATE TABLE webhook_signed_bodies (
    source          text NOT NULL,              -- webhook source name
    body_sha256     bytea NOT NULL,
    key             text NOT NULL DEFAULT '',   -- the first delivery's key ('' when it had none)
    request_id      uuid NOT NULL REFERENCES requests (id) DEFERRABLE INITIALLY DEFERRED,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (source, body_sha256)
);
CREATE INDEX webhook_signed_bodies_expiry_idx ON webhook_signed_bodies (expires_at);
