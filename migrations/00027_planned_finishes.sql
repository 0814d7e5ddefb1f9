-- Release, then end: a request whose end gives vGPUs back to Placement
-- (an agent's result, a failure and its compensation) does not end in the
-- transaction that plans the releases (planned_releases). That transaction
-- records the end here and commits; the releases are made with no
-- transaction open; a second short transaction deletes the releases made
-- and, once none of those the end waits on is left, moves the request to
-- its final state (audit, notification, callback) and deletes the row. A
-- request seen final has its units back in Placement.
-- +goose Up

-- The final state a request takes once the planned releases it waits on
-- (releases: planned_releases.attachment_id) are made. A crash between the
-- release and its record leaves both rows; the sweep makes the release
-- again (it counts as done) and ends the request, once.
CREATE TABLE planned_finishes (
    request_id uuid PRIMARY KEY REFERENCES requests (id) ON DELETE CASCADE,
    state      text NOT NULL CHECK (state IN ('succeeded', 'failed')),
    reason     text NOT NULL DEFAULT '',
    code       text NOT NULL DEFAULT '',
    releases   uuid[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

