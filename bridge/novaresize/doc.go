// Package novaresize is the Nova-native path of the bridge: Nova claims
// the vGPU, not the bridge. The bridge resizes the server to a flavor
// carrying the wanted vGPU (attach), another profile or count (resize) or
// none (release), and lets Nova's scheduler claim; it only dry-runs
// Placement to fail fast. A request moves
//
//	decided/queued → dispatched/resizing   the resize call (nova_resizes.step resize → resizing)
//	  → dispatched/verifying               instance.resize_finish.end: verify_vgpu to the target host's agent
//	                                       (a release has nothing to verify and goes on to confirm)
//	  → dispatched/confirming              the agent verified: confirmResize
//	  → succeeded                          instance.resize_confirm.end (or the server ACTIVE on the new flavor)
//
// A failed verification reverts (phase compensating, revertResize) and the
// request fails with the agent's reason; compute_task.migrate_server.error
// (NoValidHost) and instance.resize*.error fail it with Nova's. Each step
// has a deadline; a resize Nova is still working on at its deadline is
// followed to its end (phase overdue) and then reverted or confirmed as
// Config.OnDeadline says. A request cancelled mid-resize is reverted.
// A move (a rule's move() on a vGPU of the instance's flavor, off a
// faulted GPU) is a cold migration, Nova's migrate action with the flavor
// kept, that goes through the same steps; a vGPU verified back on the GPU
// it had to leave reverts it.
// The state lives in nova_resizes; Nova calls are made by one replica at
// a time under a lease, and a call is preceded by a read of the server,
// so a call a crash interrupted is not made twice.
//
// The code follows a resize's steps, one file each:
//
//	path.go      the Path, its collaborators (Nova, Pipeline, Capacity, Controls) and configuration
//	start.go     Act: a plan's nova_resize step becomes a nova_resizes row (step resize)
//	run.go       Run, Once: the loop that makes the due Nova calls, under the lease
//	resize.go    the resize call (resize → resizing)
//	notify.go    Nova's notifications followed into the resize (Events), tenants' own resizes
//	verify.go    a finished resize: verify_vgpu to the agent and its answer (TakeResult)
//	confirm.go   confirmResize and the request's success
//	revert.go    compensation: revertResize and the request's failure
//	deadline.go  steps past their deadline, followed while overdue
//	store.go     the nova_resizes row: lock, step, audit
//	capacity.go  DryRun, the Placement mirror's fast no (Capacity)
package novaresize
