-- The bridge learns instances from Nova's API as well as from Nova's
-- notifications: once at first start (every server), and then by Nova's
-- changes-since filter from the start of the last listing that finished,
-- so that the servers of a cloud the bridge is installed into are known,
-- and a queue lost with its notifications is caught up. One row.
-- +goose Up

CREATE TABLE nova_server_sync (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    -- listed_from: the start of the last listing that finished (the next
    -- one asks for changes since then, less a margin for clocks).
    listed_from timestamptz NOT NULL,
    full_at     timestamptz NOT NULL, -- the first (full) listing's end
    servers     integer NOT NULL,     -- servers the last listing read
    changed     integer NOT NULL,     -- instance rows it wrote
    updated_at  timestamptz NOT NULL DEFAULT now()
);

