// Package direct is the direct path of the bridge: the bridge itself
// attaches and detaches vGPUs by queueing signed commands for the agents
// (attach_vgpu, detach_vgpu, remove_mdev …) in the outbox. A request
// moves
//
//	decided/queued → dispatched/<phase of the command running>  each agent result, in order
//	  → succeeded   every command succeeded: new vGPUs attached, released ones' claims given back
//	  → failed      a command failed or was refused, or the deadline passed: compensated
//
// Compensation undoes what a failed request began: the Placement claims of
// the vGPUs it was making are given back and, for what reached an agent,
// detach_vgpu and remove_mdev are queued; vGPUs it was taking back stay
// (and the old vGPUs of a failed profile change are attached again).
//
// The Path plugs into the pipeline (package pipeline) as package
// novaresize does: it carries out the plans of the direct path (ActPlan:
// the pipeline's Act stage and the second transaction of a decision whose
// claims it made with Claim), its own stage makes the vGPUs follow a Nova
// move or host maintenance of their instance (FollowMove), it
// takes the agent results (TakeResult), it is the pipeline's Failer
// (FailRequest, whatever path ran the request), and its loop (Run) fails
// the requests whose deadline passed.
//
//	path.go      the Path, what it shares with the pipeline, Wire
//	act.go       ActPlan: claims, attachments and commands; Claim, ReleaseClaims
//	result.go    TakeResult: an agent's result moves the request on; complete
//	fail.go      FailRequest and compensate: claims back, undo commands, restores
//	deadline.go  Run, CheckDeadlines: requests past their deadline, ended ones in flight
//	follow.go    FollowMove, the stage of moves and maintenance
//	move.go      handleMove: vGPUs released on the old host, applied again on the new
//	maintenance.go handleMaintenance: host maintenance's detach and attach halves
//	commands.go  the path's commands (AttachCommands, ReleaseCommands) and their outbox rows
package direct
