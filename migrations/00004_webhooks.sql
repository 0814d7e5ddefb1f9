-- Webhooks and the request store: idempotency keys, callbacks on
-- a request's final state with every delivery attempt, and the request
-- columns the status API shows.
-- +goose Up

ALTER TABLE requests
    ADD COLUMN callback_url     text,               -- where the final state is POSTed; NULL: nowhere
    ADD COLUMN idempotency_key  text,               -- Idempotency-Key or webhook-id of the first delivery
    ADD COLUMN decided_at       timestamptz,
    ADD COLUMN dispatched_at    timestamptz;
CREATE INDEX requests_source_idx ON requests (source, created_at);

-- Idempotency keys, per source, kept for a day (webhooks ttl). A retry with
-- the same key and body gets the stored answer; another body gets 409.
CREATE TABLE webhook_idempotency (
    source          text NOT NULL,              -- webhook source name
    key             text NOT NULL,
    body_sha256     bytea NOT NULL,
    -- Deferred: the key is claimed before its request is inserted, in the
    -- same transaction.
    request_id      uuid NOT NULL REFERENCES requests (id) DEFERRABLE INITIALLY DEFERRED,
    status          integer NOT NULL,           -- HTTP status of the first answer
    response        bytea NOT NULL,             -- body of the first answer, byte for byte
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (source, key)
);
CREATE INDEX webhook_idempotency_expiry_idx ON webhook_idempotency (expires_at);

-- Callbacks: written by the request store's transition to a final state, in
-- its transaction; delivered at least once by the webhook callback loop.
CREATE TABLE request_callbacks (
    id              bigserial PRIMARY KEY,
    request_id      uuid NOT NULL REFERENCES requests (id),
    source          text NOT NULL,              -- webhook source name (signing, host allowlist)
    url             text NOT NULL,
    payload         jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending','delivered','failed','refused')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX request_callbacks_due_idx ON request_callbacks (next_attempt_at) WHERE state = 'pending';
CREATE INDEX request_callbacks_request_idx ON request_callbacks (request_id);

-- Every delivery attempt of a callback, successful or not.
CREATE TABLE request_callback_attempts (
    id              bigserial PRIMARY KEY,
    callback_id     bigint NOT NULL REFERENCES request_callbacks (id),
    attempt         integer NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    status_code     integer,                    -- NULL when no answer came
    error           text,
    duration_ms     integer NOT NULL
);
CREATE INDEX request_callback_attempts_cb_idx ON request_callback_attempts (callback_id, attempt);
