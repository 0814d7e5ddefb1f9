-- A message delivered again after it was dead-lettered (a redelivery once
-- the consumer died before its acknowledgement, or a publisher's retry) is
-- kept once: dead letters are unique per source on their message_id, or on
-- the SHA-256 of the delivered body when they have none (dedupe_key).
-- +goose Up
ALTER TABLE dead_letters ADD COLUMN dedupe_key text;
-- Rows kept before: the first of each message_id gets its key; copies
-- already kept stay, without one.
UPDATE dead_letters d SET dedupe_key = 'id:' || d.message_id
WHERE d.message_id IS NOT NULL
  AND d.id = (SELECT min(x.id) FROM dead_letters x WHERE x.source = d.source AND x.message_id = d.message_id);
CREATE UNIQUE INDEX dead_letters_dedupe_idx ON dead_letters (source, dedupe_key);

