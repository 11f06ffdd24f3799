// Package launcher is the gotrain agent: the process `gotrain launch` runs on
// every node. It joins the job's coordinator (starting an embedded one on a
// single node), waits for its ranks, starts one worker process per rank with
// the job's environment, relays its workers' rendezvous calls to the
// coordinator over a local socket, reports how each worker ended, stops and
// restarts workers when the coordinator ends a generation, and forwards
// signals. No worker outlives its agent: each runs in its own process group
// with PR_SET_PDEATHSIG, and the agent kills the whole group when it stops.
package launcher
