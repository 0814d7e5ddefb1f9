-- The frame-rate limiter the workload asked for on a direct-path vGPU
-- (NULL: the driver's default). The agent writes it to the device's
-- nvidia/vgpu_params before each attach, so a re-attach after a move or
-- a compensation keeps it.
-- +goose Up
ALTER TABLE vgpu_attachments ADD COLUMN frame_rate_limit boolean;

