-- Deferred evaluations: a policy rule whose cooldown or for: window holds
-- it back is evaluated again when the hold ends, not dropped. The pipeline
-- closes the event it held back and queues a follow-up row, a copy of it
-- due at the hold's end (not_before): deferred_from names the event first
-- held back (a chain of deferrals keeps the first), deferred_rules the
-- rules to evaluate again. A follow-up starts with no attempts: a deferral
-- is not a failure, and max_attempts counts failures only.
-- +goose Up
ALTER TABLE events
    ADD COLUMN deferred_from  bigint,
    ADD COLUMN deferred_rules text[];
