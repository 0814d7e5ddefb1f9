// Package placement connects the bridge to OpenStack Placement: a client
// for the calls the bridge makes (with every error classified in one place),
// the inventory sync into a Postgres mirror, and claims of vGPU units by
// writing a consumer's allocations with generation checks.
//
// The decision itself lives in placement/engine (pure) over the in-memory
// index in placement/index; profile names come from placement/catalog.
// The bridge never writes Placement inventories or traits: Nova owns them.
package placement
