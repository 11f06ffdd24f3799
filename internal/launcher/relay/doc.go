// Package relay is the workers' side of the agent: the gRPC server on the
// agent's unix socket (in its private directory, sockdir.go) that every
// worker and standby of the node dials. It forwards the workers'
// rendezvous calls (KVPut, KVGet, Barrier, ReportProgress) to the
// coordinator, checks each Attach hello against what the agent started
// (the Claims, with the peer's pid from SO_PEERCRED), keeps the attached
// workers' streams and progress in the Hub, which reports them to the
// coordinator once a second and gathers a hang's evidence, and holds the
// standbys' streams until the agent's machine accepts and assigns them.
//
// It is separate from the agent (package launcher) because it is the one
// place where other processes reach the agent: everything it serves runs
// on gRPC's goroutines, never on the agent's loop. What it needs of the
// agent comes in as values and funcs (Server's Post and LoopDone); the
// agent drives it through the Hub's, the Claims' and the Standbys'
// exported methods. It never imports package launcher.
package relay
