-- Cold migration or resize of a VM holding a direct-path vGPU to another
-- host (README, "Nova moves and vGPUs"): until Nova confirms it, the
-- source keeps the guest's definition, and Nova 26 keeps the source's
-- allocations (the direct-path VGPU with them) in the migration's
-- consumer, for a revert. The bridge keeps the vGPU's mdev on the source
-- while the move awaits its confirm: the vGPU is 'kept' (provider_uuid
-- still names its GPU, whose claim the migration consumer holds). The
-- confirm removes its mdev (released); a revert, which moves the claim
-- back into the instance's consumer and starts the guest again on the
-- source with its mdev, marks it attached again.
-- +goose Up
ALTER TABLE vgpu_attachments DROP CONSTRAINT vgpu_attachments_state_check;
ALTER TABLE vgpu_attachments ADD CONSTRAINT vgpu_attachments_state_check
    CHECK (state IN ('pending','attached','releasing','released','failed','held','kept'));
