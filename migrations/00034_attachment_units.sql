-- The Placement units a vGPU holds of its resource class when they are
-- not its amount: a vGPU of a mixed bridge-owned GPU ([placement]
-- bridge_owned_vf_gpus = HOST/PF=mixed) holds its type's framebuffer in
-- MiB of CUSTOM_VGPU_BRIDGE_FB_MIB. NULL: amount.
-- +goose Up
ALTER TABLE vgpu_attachments ADD COLUMN units integer CHECK (units > 0);
