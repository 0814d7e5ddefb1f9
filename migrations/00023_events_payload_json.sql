-- The inbox keeps each event's payload as the JSON it arrived as (json)
-- instead of Postgres's decomposed jsonb: nothing queries inside a payload
-- on a hot path, and parsing a 3 KB notification into jsonb cost Postgres
-- about as much CPU as the rest of its insert. json still refuses a payload
-- that is not JSON, and ->/->> still read it.
--
-- Upgrade: the statement rewrites the events table (and rebuilds its
-- indexes) under an exclusive lock; its time grows with the rows the
-- retention keeps ([retention] events). See the upgrade guide.
-- +goose Up
ALTER TABLE events ALTER COLUMN payload TYPE json USING payload::json;

-- +goose StatementBegin
DO $$
BEGIN
    ALTER TABLE events ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; events.payload keeps the default compression';
END
$$;
-- +goose StatementEnd
