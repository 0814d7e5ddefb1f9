-- Pipeline and dispatch: decisions, direct-path vGPU attachments,
-- outbox sequencing, request deadlines and the inbox's retry bookkeeping.
-- +goose Up

-- Inbox: a failed attempt backs off (not_before) and is counted; after
-- [pipeline] max_attempts the event is closed with status 'failed'.
ALTER TABLE events
    ADD COLUMN attempts     integer NOT NULL DEFAULT 0,
    ADD COLUMN not_before   timestamptz,
    ADD COLUMN last_error   text;

-- Requests: the deadline by which the agents must have answered; past it
-- the request fails and its compensation runs.
ALTER TABLE requests
    ADD COLUMN deadline_at  timestamptz;
CREATE INDEX requests_deadline_idx ON requests (deadline_at)
    WHERE state IN ('accepted','decided','dispatched') AND deadline_at IS NOT NULL;

-- One decision per processed event: the policy's answer with its
-- explanation, written in the transaction that writes the intent's commands.
CREATE TABLE decisions (
    id              bigserial PRIMARY KEY,
    event_id        bigint NOT NULL,
    request_id      uuid,
    instance_uuid   uuid,
    policy          text,
    rejected        boolean NOT NULL DEFAULT false,
    reason          text,
    decision        jsonb NOT NULL,
    replica         text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX decisions_event_idx ON decisions (event_id);
CREATE INDEX decisions_request_idx ON decisions (request_id);

-- Direct-path vGPUs: a Placement claim in the instance's consumer and the
-- mdev the agent creates for it. id is the mdev UUID.
CREATE TABLE vgpu_attachments (
    id                  uuid PRIMARY KEY,
    instance_uuid       uuid NOT NULL,
    request_id          uuid,               -- the request that attached it
    release_request_id  uuid,               -- the request releasing it
    host                text NOT NULL,      -- compute service host
    node                text,               -- root provider name
    provider_uuid       uuid,               -- GPU child provider holding the claim
    resource_class      text,
    amount              integer NOT NULL DEFAULT 1,
    held_after          integer,            -- units the consumer held on the provider right after the claim
    pci_address         text,
    type_id             text,
    profile             text,
    trait               text,
    mode                text,               -- live | config | cold
    state               text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending','attached','releasing','released','failed')),
    reason              text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    released_at         timestamptz
);
CREATE INDEX vgpu_attachments_instance_idx ON vgpu_attachments (instance_uuid)
    WHERE state IN ('pending','attached','releasing');
CREATE INDEX vgpu_attachments_request_idx ON vgpu_attachments (request_id);

-- Outbox: commands of one request go out in seq order, each once its
-- predecessors are done; compensation commands are told apart.
ALTER TABLE commands
    ADD COLUMN seq              integer NOT NULL DEFAULT 0,
    ADD COLUMN purpose          text NOT NULL DEFAULT 'action'
        CHECK (purpose IN ('action','compensation')),
    ADD COLUMN attachment_id    uuid,
    ADD COLUMN instance_uuid    uuid,
    ADD COLUMN publish_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN last_error       text;
CREATE INDEX commands_request_idx ON commands (request_id, seq);
CREATE INDEX commands_open_idx ON commands (created_at)
    WHERE sent_at IS NULL AND finished_at IS NULL;

-- Reports: the agent's sequence number of the last one kept.
ALTER TABLE hosts
    ADD COLUMN report_seq   bigint,
    ADD COLUMN report_errors jsonb;
