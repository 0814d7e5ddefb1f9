-- The Nova-native path changes and gives back vGPUs too, and follows a
-- resize past its deadline instead of leaving it.
-- +goose Up

-- kind: attach (a flavor without vGPU → one with), resize (to a flavor
-- with another profile or count), release (to the flavor without vGPU).
ALTER TABLE nova_resizes ADD COLUMN kind text NOT NULL DEFAULT 'attach'
    CHECK (kind IN ('attach','resize','release'));
-- untyped: a flavor asking for VGPU without the type trait may be chosen
-- (every GPU provider offered only the wanted type when it was decided).
ALTER TABLE nova_resizes ADD COLUMN untyped boolean NOT NULL DEFAULT false;
-- overdue_at: when a step passed its deadline while Nova still worked;
-- the resize is followed to its end, then confirmed or reverted as
-- [nova] on_deadline says.
ALTER TABLE nova_resizes ADD COLUMN overdue_at timestamptz;
