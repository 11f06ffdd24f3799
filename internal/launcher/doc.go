// Package launcher is the gotrain agent: the process `gotrain launch` runs on
// every node. It joins the job's coordinator (starting an embedded one on a
// single node), waits for its ranks, starts one worker process per rank with
// the job's environment, relays its workers' rendezvous calls to the
// coordinator over a local socket, reports how each worker ended, stops and
// restarts workers when the coordinator ends a generation, and forwards
// signals. No worker outlives its agent: each runs in its own process group
// with PR_SET_PDEATHSIG, and the agent kills the whole group when it stops.
//
// This package is the agent's shell: the loop that steps the machine
// (internal/launcher/agentcore) and carries out its actions, the registry of its
// processes, and its contact with the coordinator. Each subsystem with one
// job is a package of its own that never imports this one: supervise
// (processes), relay (the workers' socket), observe (what the agent sees
// of its workers from outside), output (their console lines and log
// files), placement (GPUs and CPUs), pystandby (Python standbys), signals
// (SIGINT and SIGTERM), explain (the lines a person reads) and workerenv
// (the workers' arguments and PyTorch settings).
package launcher
