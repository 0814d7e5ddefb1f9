-- Policy engine state: what load rules remember across events,
-- shared by every bridge replica so hysteresis and cooldown hold whichever
-- replica handles an instance's next GPU_LOAD event or alert.
-- +goose Up

-- When a load rule's condition ("for" window) started to hold for an
-- instance. A row is armed by the first event that finds the condition
-- true and removed when it is false again or the rule fires.
CREATE TABLE policy_load_since (
    instance_uuid   text NOT NULL,
    rule            text NOT NULL,
    since           timestamptz NOT NULL,
    PRIMARY KEY (instance_uuid, rule)
);

-- When a decision last changed an instance's vGPUs (starts the cooldown).
CREATE TABLE policy_last_change (
    instance_uuid   text PRIMARY KEY,
    changed_at      timestamptz NOT NULL
);
