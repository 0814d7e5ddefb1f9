-- Placement mirror: resource providers with their generations and
-- trees, inventories, traits, usages, aggregates, and the allocations held on
-- vGPU providers. Written by the placement syncer (one replica at a time,
-- under an advisory lock); read to rebuild the in-memory index and to answer
-- the operator API. The foundation's gpus table is kept filled from it.
-- +goose Up

CREATE TABLE placement_providers (
    uuid            uuid PRIMARY KEY,
    name            text NOT NULL,
    generation      bigint NOT NULL,
    parent_uuid     uuid,
    root_uuid       uuid NOT NULL,
    synced_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX placement_providers_root_idx ON placement_providers (root_uuid);
CREATE INDEX placement_providers_name_idx ON placement_providers (name);

CREATE TABLE placement_inventories (
    provider_uuid    uuid NOT NULL REFERENCES placement_providers (uuid) ON DELETE CASCADE,
    resource_class   text NOT NULL,
    total            bigint NOT NULL,
    reserved         bigint NOT NULL DEFAULT 0,
    min_unit         bigint NOT NULL DEFAULT 1,
    max_unit         bigint NOT NULL,
    step_size        bigint NOT NULL DEFAULT 1,
    allocation_ratio double precision NOT NULL DEFAULT 1,
    PRIMARY KEY (provider_uuid, resource_class)
);
CREATE INDEX placement_inventories_class_idx ON placement_inventories (resource_class);

CREATE TABLE placement_traits (
    provider_uuid   uuid NOT NULL REFERENCES placement_providers (uuid) ON DELETE CASCADE,
    trait           text NOT NULL,
    PRIMARY KEY (provider_uuid, trait)
);
CREATE INDEX placement_traits_trait_idx ON placement_traits (trait);

-- Usages by resource class (of vGPU providers: the sum of their allocations).
CREATE TABLE placement_usages (
    provider_uuid   uuid NOT NULL REFERENCES placement_providers (uuid) ON DELETE CASCADE,
    resource_class  text NOT NULL,
    used            bigint NOT NULL,
    PRIMARY KEY (provider_uuid, resource_class)
);

CREATE TABLE placement_aggregates (
    provider_uuid   uuid NOT NULL REFERENCES placement_providers (uuid) ON DELETE CASCADE,
    aggregate_uuid  uuid NOT NULL,
    PRIMARY KEY (provider_uuid, aggregate_uuid)
);

-- Who holds what on vGPU providers (GET /resource_providers/{uuid}/allocations).
CREATE TABLE placement_allocations (
    provider_uuid   uuid NOT NULL REFERENCES placement_providers (uuid) ON DELETE CASCADE,
    consumer_uuid   uuid NOT NULL,
    resource_class  text NOT NULL,
    used            bigint NOT NULL,
    PRIMARY KEY (provider_uuid, consumer_uuid, resource_class)
);
CREATE INDEX placement_allocations_consumer_idx ON placement_allocations (consumer_uuid);

-- One row: where the syncer stands.
CREATE TABLE placement_sync_state (
    id              int PRIMARY KEY CHECK (id = 1),
    last_full_at    timestamptz,
    last_sync_at    timestamptz,
    providers       int NOT NULL DEFAULT 0,
    syncer          text
);
INSERT INTO placement_sync_state (id) VALUES (1);

-- gpus rows now come from the mirror; remember which resource class holds
-- the GPU's vGPU inventory.
ALTER TABLE gpus ADD COLUMN resource_class text;
