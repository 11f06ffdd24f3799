// Package coordinator serves a gotrain job's control plane over gRPC: it
// implements gotrainv1.CoordinatorServer on top of the pure job state machine
// of package job, feeding it the events the agents report and carrying out the
// actions it returns (streaming generation events to agents, answering
// barriers). It also keeps the job's write-once key-value store (package kv).
//
// Every call must carry the job token (package token); calls without it fail
// with PermissionDenied.
//
// An agent calls Join, then WatchGenerations with the node id it got. The
// stream delivers, in order, every event for the node (started, ended,
// finished) after the last one the agent got (after_seq), and ends after
// finished. The agent numbers its watch streams and the newest wins: a stream
// it replaced, or an older one that arrives late (queued in a partition),
// ends with AlreadyExists ("superseded"), which the agent takes as a blip. A
// stream that breaks makes the node unreachable, not lost: the node is lost
// only when no new stream comes within its node timeout (--node-timeout), or
// at once when a probe finds its agent's process gone (reach.go); a blip
// shorter than the timeout changes nothing. A lost node's stream ends with
// Aborted. Barrier calls fail with Aborted when their generation is not
// running or ends first; the caller should wait for the next generation.
// Mistakes by the caller come back as InvalidArgument, NotFound (unknown
// node), AlreadyExists (duplicate agent, superseded watch stream, KV
// conflict) or FailedPrecondition (joining a started job, or with a job-wide
// setting that contradicts the job's: see checkSettings; settings that differ
// only in timing come back as JoinResponse.warnings); calls that wait end
// with Unavailable when the coordinator stops.
//
// # Usage
//
//	srv, err := coordinator.New(coordinator.Config{Job: job.Config{RunID: id, Nodes: 2}, Token: tok, Logger: log})
//	if err != nil { ... }
//	lis, err := net.Listen("tcp", ":29400")
//	if err != nil { ... }
//	ctx, cancel := context.WithCancel(ctx)
//	go func() { <-srv.Finished(); cancel() }()
//	if err := srv.Serve(ctx, lis); err != nil { ... }
//	res := srv.Result() // nil if ctx ended before the job finished
//
// Package internal/coordinator/host does all of this (with gossip and metrics) for
// both `gotrain coordinator` and the coordinator embedded in an agent.
package coordinator
