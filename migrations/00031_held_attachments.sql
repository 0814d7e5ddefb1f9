-- Evacuation of a VM holding a direct-path vGPU (README, "Moves"): when
-- Nova's compute service of a host is forced down, the bridge takes the
-- direct-path vGPUs of the host's instances out of their consumers in
-- Placement (Nova 26's evacuation hands the destination's spawn the whole
-- allocation, and its libvirt driver refuses a VGPU of another host's
-- GPU). Such a vGPU is 'held': its mdev stays on the host, its claim is
-- gone. After the evacuation it is applied again on the new host and its
-- provider forgotten (provider_uuid NULL: its mdev on the old host is
-- removed once that host is back); when the host comes back without an
-- evacuation its claim is made again on the same GPU and it is attached.
-- +goose Up
ALTER TABLE vgpu_attachments DROP CONSTRAINT vgpu_attachments_state_check;
ALTER TABLE vgpu_attachments ADD CONSTRAINT vgpu_attachments_state_check
    CHECK (state IN ('pending','attached','releasing','released','failed','held'));
CREATE INDEX vgpu_attachments_held_idx ON vgpu_attachments (host) WHERE state = 'held';
