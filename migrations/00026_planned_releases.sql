-- Decide, record, then release: a transaction that gives a vGPU's claim
-- back to Placement (an agent's result, a deadline, a Nova-path step)
-- records the release here and commits; the release is made with no
-- transaction open, and a short statement deletes the row once Placement
-- gave the units back.
-- +goose Up

-- A Placement release a committed transaction planned and no one has made
-- yet. The process that committed it makes it at once; a row still here
-- after its lease (not_before) is made by any replica's sweep (a crash
-- between the commit and the release, or Placement down). A release made
-- already counts as done when made again: held_after is what the consumer
-- held on the provider right after the claim being given back, and
-- placement.Service.ReleaseUnits takes a holding below it as released.
CREATE TABLE planned_releases (
    attachment_id  uuid PRIMARY KEY,
    request_id     uuid,
    instance_uuid  uuid NOT NULL,
    provider_uuid  uuid NOT NULL,
    resource_class text NOT NULL,
    amount         integer NOT NULL CHECK (amount > 0),
    held_after     integer NOT NULL DEFAULT 0,
    attempts       integer NOT NULL DEFAULT 0,
    last_error     text,
    not_before     timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX planned_releases_due_idx ON planned_releases (not_before);
CREATE INDEX planned_releases_instance_idx ON planned_releases (instance_uuid);
