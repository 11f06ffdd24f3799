// Package worker is the library a Go training program uses inside a job
// started by `gotrain launch`: it tells the process its rank, world size, local
// rank and generation, and builds communicators whose collectives move the data
// (all-reduce, broadcast, all-gather, reduce-scatter, barrier).
//
// A worker talks only to its own agent, over the local socket named in
// GOTRAIN_AGENT; the agent relays rendezvous traffic to the job's coordinator.
// Collective data never passes through the agent: the CPU backend connects the
// ranks directly over TCP, the NCCL backend through NCCL.
//
// # Usage
//
//	w, err := worker.Init(ctx)
//	if err != nil { ... }
//	defer w.Close()
//	c, err := w.NewComm(ctx, "grads")
//	if err != nil { ... }
//	defer c.Close()
//	err = c.AllReduce(ctx, worker.Host(grads), worker.Host(grads), worker.Avg)
package worker
