-- The vGPUs a request is taking back are read by that request: when it
-- completes, when it is compensated, and for its notifications (with the
-- vGPUs it makes). Without an index each of those read every attachment.
-- +goose Up

CREATE INDEX vgpu_attachments_release_idx ON vgpu_attachments (release_request_id) WHERE release_request_id IS NOT NULL;
