-- The guest driver version declared in the server's metadata
-- (vgpu_bridge:guest_driver), as the newest notification carried it;
-- NULL when none is declared. The agent's report, once the guest driver
-- has loaded, and a webhook's guest_driver field take precedence.
-- +goose Up
ALTER TABLE instances ADD COLUMN guest_driver text;
