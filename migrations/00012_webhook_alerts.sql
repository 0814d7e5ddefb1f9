-- Alertmanager alerts already received, per source, kept as long as the
-- idempotency keys (webhooks ttl): Alertmanager sends an alert again at
-- every repeat_interval, after a failed delivery and whenever its group
-- changes, without an idempotency key. Each state change of an alert
-- (fingerprint, status, start) acts once; its repeats are listed as
-- skipped.
-- +goose Up

CREATE TABLE webhook_alerts (
    source          text NOT NULL,              -- webhook source name
    alert_key       bytea NOT NULL,             -- sha256 of fingerprint (or labels), status, startsAt
    request_id      uuid NOT NULL REFERENCES requests (id) DEFERRABLE INITIALLY DEFERRED,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (source, alert_key)
);
CREATE INDEX webhook_alerts_expiry_idx ON webhook_alerts (expires_at);
