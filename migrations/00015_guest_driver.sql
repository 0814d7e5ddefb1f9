-- The guest driver version declared in the server's metadata
-- (vgpu_bridge:guest_driver), as the newest notification carried it;
-- NULL when none is declared. The agent's report, once the guest driver
-- has loaded, and a webhook's guest_driver field take precedence.
-- +goose Up
ALTER TABLE instances ADD COLUMN guest_driver text;

-- Load windows now carry the video engines (00013 described three fields).
COMMENT ON COLUMN instance_load.samples IS
    '[[unix seconds, SM util %, framebuffer used MiB, encoder util %, decoder util %], ...], oldest first; '
    'a field a report did not carry is null, and windows kept before the encoder and decoder were reported have three';
