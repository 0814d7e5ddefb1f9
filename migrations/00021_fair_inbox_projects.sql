-- Fair inbox: the pipeline takes at most [pipeline] project_share events of
-- one project per batch, projects in the order of their oldest waiting
-- event, so one project's backlog cannot fill every batch.
-- +goose Up

-- The unprocessed events by project, then id: the pipeline walks the
-- projects that have a backlog (one probe each) and reads the first events
-- of each. It takes the place of events_unprocessed_idx (id), so an insert
-- still updates as many indexes as before; what that index served (the
-- backlog's size and oldest entry, on the status page) reads this one.
-- Events of no known project (project_id NULL) count as the project ''.
CREATE INDEX events_unprocessed_project_idx ON events ((coalesce(project_id, '')), id) WHERE processed_at IS NULL;
DROP INDEX events_unprocessed_idx;
