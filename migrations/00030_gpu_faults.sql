-- GPU faults (operator guide, "GPU faults"): an agent reports a GPU's fault (a fatal Xid, an
-- uncorrectable ECC error, a row remap or retired pages pending, the GPU
-- lost); the bridge then drains the GPU with the fault as its reason and
-- adds the fault trait (CUSTOM_VGPU_BRIDGE_GPU_FAULT) to its Placement
-- provider. `vgpuctl gpu undrain` clears the mark and the trait.
--   fault_reason:   the fault the GPU is marked for; NULL once undrained;
--   faulted_at:     when it was marked;
--   reported_fault: the fault its agent reports now (NULL: none). A fault
--                   marks the GPU when it starts being reported (or
--                   changes), so an operator's undrain holds while the
--                   agent still reports the fault it was undrained over.
-- +goose Up
ALTER TABLE gpus
    ADD COLUMN fault_reason   text,
    ADD COLUMN faulted_at     timestamptz,
    ADD COLUMN reported_fault text;
CREATE INDEX gpus_fault_idx ON gpus (provider_uuid) WHERE fault_reason IS NOT NULL;
