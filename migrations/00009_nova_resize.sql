-- Nova-native path: the bridge's resizes of servers to flavors
-- carrying a vGPU, followed through Nova's notifications, verified on the
-- target host by its agent, then confirmed or reverted.
-- +goose Up

-- One row per request that resizes through Nova. step says what comes next:
--   resize      the resize call is due (flavor not chosen yet)
--   resizing    Nova resizes; waiting for instance.resize_finish.end
--   verifying   verify_vgpu sent to the target host's agent
--   confirm     the confirmResize call is due
--   confirming  waiting for instance.resize_confirm.end
--   revert      the revertResize call is due (fail_code/fail_reason say why)
--   reverting   waiting for instance.resize_revert.end
--   done        finished; the request holds the outcome
-- A replica takes a row whose call is due with FOR UPDATE SKIP LOCKED and
-- reads the server first, so a call interrupted by a crash is not made twice.
CREATE TABLE nova_resizes (
    request_id          uuid PRIMARY KEY REFERENCES requests (id),
    instance_uuid       uuid NOT NULL,
    step                text NOT NULL DEFAULT 'resize'
        CHECK (step IN ('resize','resizing','verifying','confirm','confirming','revert','reverting','done')),
    profile             text,
    type_id             text,
    trait               text NOT NULL,
    count               integer NOT NULL DEFAULT 1,
    old_flavor          text,               -- name of the flavor before the resize
    flavor_id           text,               -- the flavor resized to
    flavor_name         text,
    source_host         text,
    target_host         text,
    verify_command_id   uuid,
    nova_request_id     text NOT NULL,      -- X-OpenStack-Request-ID of the bridge's calls
    fail_code           text,               -- why a revert runs, and the request's end
    fail_reason         text,
    due_at              timestamptz,        -- a Nova call is due (resize, confirm, revert)
    deadline_at         timestamptz,        -- the current step must end by then
    resize_sent_at      timestamptz,        -- set (committed) just before the resize call
    attempts            integer NOT NULL DEFAULT 0,
    last_error          text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz
);
-- One resize of an instance at a time.
CREATE UNIQUE INDEX nova_resizes_active_idx ON nova_resizes (instance_uuid) WHERE step <> 'done';
CREATE INDEX nova_resizes_due_idx ON nova_resizes (due_at) WHERE step IN ('resize','confirm','revert');
CREATE INDEX nova_resizes_deadline_idx ON nova_resizes (deadline_at) WHERE step <> 'done';
CREATE INDEX nova_resizes_verify_idx ON nova_resizes (verify_command_id) WHERE verify_command_id IS NOT NULL;
