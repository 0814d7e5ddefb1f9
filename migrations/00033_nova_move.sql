-- A cold migration through Nova off a faulted GPU (policy intent move() on
-- bridge.GPU_FAULT for a vGPU that comes with the instance's flavor): a
-- nova_resizes row of kind 'move' that calls Nova's migrate action instead
-- of a resize, and follows the same steps (resizing, verifying,
-- confirming; a revert on failure). leave_gpu is the GPU (PCI address, on
-- source_host) the vGPU must leave: a migration that Nova's scheduler
-- ends on that same GPU is reverted.
-- +goose Up
ALTER TABLE nova_resizes DROP CONSTRAINT nova_resizes_kind_check;
ALTER TABLE nova_resizes ADD CONSTRAINT nova_resizes_kind_check
    CHECK (kind IN ('attach','resize','release','move'));
ALTER TABLE nova_resizes ADD COLUMN leave_gpu text;
