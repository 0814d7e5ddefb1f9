-- Re-typing a bridge-owned VF GPU ([placement] bridge_owned_vf_gpus): the
-- type the bridge offers on the GPU, when it is no longer the declared one,
-- and the step of the re-type that made it so. The steps run in this order,
-- each recorded before the next starts, so that Placement never offers a
-- type the bridge would not attach:
--   withdrawing: the row is written (the intent); then the provider stops
--                offering the old type (inventory reserved, trait removed);
--   typed:       the provider offers nothing; type_id is the GPU's type;
--   done:        the new type's inventory and trait are published.
-- A bridge that stops at any step resumes from it (placement.Service.
-- PublishOwned); a re-type that finds the GPU in use after the withdrawal
-- is undone (the old type published again, the row restored or deleted).
-- +goose Up
CREATE TABLE owned_gpu_types (
    host       text NOT NULL,
    pci        text NOT NULL,
    type_id    text NOT NULL,
    from_type  text NOT NULL,
    step       text NOT NULL CHECK (step IN ('withdrawing', 'typed', 'done')),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (host, pci)
);

