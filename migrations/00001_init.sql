-- Foundation schema. Later migrations extend it.
-- +goose Up

-- Nova compute service hosts, as agents report them (package agent/protocol).
CREATE TABLE hosts (
    name            text PRIMARY KEY,          -- Nova's compute service host
    node            text,                      -- hypervisor node = Placement root provider name
    agent_version   text,
    driver_version  text,
    disabled        boolean NOT NULL DEFAULT false,
    drained         boolean NOT NULL DEFAULT false,
    last_report_at  timestamptz,
    report          jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Physical GPUs: one Placement child resource provider each.
CREATE TABLE gpus (
    provider_uuid   uuid PRIMARY KEY,
    host            text,                      -- compute service host, once known
    node            text,                      -- root provider name
    pci_address     text,                      -- normalised sysfs form 0000:3b:00.0
    vgpu_type       text,                      -- e.g. nvidia-232
    generation      bigint NOT NULL DEFAULT 0,
    drained         boolean NOT NULL DEFAULT false,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX gpus_host_idx ON gpus (host);

-- Nova instances as the bridge knows them.
CREATE TABLE instances (
    uuid            uuid PRIMARY KEY,
    project_id      text,
    user_id         text,
    host            text,
    node            text,
    vm_state        text,
    task_state      text,
    power_state     text,
    flavor          jsonb,
    vgpu_demand     jsonb,
    last_event_type text,
    last_event_at   timestamptz,
    deleted_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX instances_host_idx ON instances (host);
CREATE INDEX instances_project_idx ON instances (project_id);

-- Inbox: every accepted event, deduplicated on (source, message_id).
CREATE TABLE events (
    id              bigserial PRIMARY KEY,
    source          text NOT NULL,             -- "nova" or "webhook:<name>"
    message_id      text NOT NULL,
    event_type      text NOT NULL,
    instance_uuid   uuid,
    occurred_at     timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    payload         jsonb NOT NULL,
    processed_at    timestamptz,
    UNIQUE (source, message_id)
);
CREATE INDEX events_instance_idx ON events (instance_uuid, id);
CREATE INDEX events_unprocessed_idx ON events (id) WHERE processed_at IS NULL;

-- Requests: what a source asked for, and where it stands (GET /v1/openapi.json).
CREATE TABLE requests (
    id              uuid PRIMARY KEY,
    source          text NOT NULL,
    kind            text NOT NULL,
    instance_uuid   uuid,
    state           text NOT NULL DEFAULT 'accepted'
        CHECK (state IN ('accepted','decided','dispatched','succeeded','failed','rejected')),
    phase           text,
    reason          text,
    code            text,
    body            jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX requests_state_idx ON requests (state) WHERE state NOT IN ('succeeded','failed','rejected');
CREATE INDEX requests_instance_idx ON requests (instance_uuid);

-- Outbox: commands to agents, written in the decision's transaction.
CREATE TABLE commands (
    id              uuid PRIMARY KEY,
    request_id      uuid REFERENCES requests (id),
    host            text NOT NULL,
    kind            text NOT NULL,
    body            jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz,
    sent_at         timestamptz,
    result_status   text,
    result          jsonb,
    finished_at     timestamptz
);
CREATE INDEX commands_unsent_idx ON commands (created_at) WHERE sent_at IS NULL;

-- Messages that could not be accepted, with the reason.
CREATE TABLE dead_letters (
    id              bigserial PRIMARY KEY,
    source          text NOT NULL,
    reason          text NOT NULL,
    raw             bytea,
    raw_truncated   boolean NOT NULL DEFAULT false,
    headers         jsonb,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- Every state change, who made it and why.
CREATE TABLE audit_log (
    id              bigserial PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text NOT NULL,
    action          text NOT NULL,
    object_type     text NOT NULL,
    object_id       text NOT NULL,
    request_id      text,
    detail          jsonb
);
CREATE INDEX audit_log_object_idx ON audit_log (object_type, object_id, id);
