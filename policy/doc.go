// Package policy decides what the bridge may do with vGPUs. It turns an event
// (a Nova notification, a webhook, an Alertmanager alert) plus a read-only
// view of state into intents — attach, release, resize, tune, set_limits,
// notify, reject — each with an explanation of which rule fired, with which
// values, and why the other rules did not.
//
// A policy is loaded from a YAML file (etc/vgpu-bridge/rules.yaml): workload
// → profile preferences, per-project quotas and attach modes, and rules whose
// conditions and actions are CEL expressions, compiled once at load. Driver
// compatibility comes from etc/vgpu-bridge/driver-compat.yaml and profiles
// from the placement/catalog package.
//
// Evaluation is pure and deterministic: no I/O, no clock other than the
// event's time (or an injected one). State that load rules need across
// events (how long a condition has held, when an instance last changed) is
// read through LoadState and written back by the caller from
// Decision.LoadUpdates; Tracker is an in-memory implementation.
package policy
