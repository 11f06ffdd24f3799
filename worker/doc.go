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
//
// # Restoring and recovering
//
// Restore is the one restore a program needs at start: every rank looks in
// its own tiers (its agent's memory, a peer agent's copy, the disk
// checkpoint), the ranks agree on the newest step any of them found, and the
// lowest rank holding it broadcasts it into every rank's buffers; Restored
// says which step, tier and rank it came from, and ErrNoState means a fresh
// start (rank 0's buffers, broadcast). Snapshots.Save hands the state after
// a step to the agent's memory.
//
//	r, err := worker.Restore(ctx, c, worker.Tiers{Snapshots: snaps, Disk: checkpoint.Dir{Path: dir}}, worker.Host(params))
//
// Run trains inside a recoverable loop: when a rank dies the others keep
// their state in memory, and the restarted processes take it from the
// lowest survivor with Generation.Restore (Generation.Source); a
// generation of new processes only (Source -1) uses Restore. See
// ExampleWorker_Run, and examples/recover for a whole program.
//
// # Data parallel
//
// DataParallel averages gradients over the ranks while backward runs, as
// PyTorch DDP does. The gradients live in one float32 buffer (host or device
// memory) laid out in reverse parameter order and cut into buckets of about
// 25 MiB; when backward has produced every gradient of a bucket (the program
// calls Ready for each parameter as its gradient is written), the bucket's
// all-reduce starts at once and overlaps the rest of backward. On a GPU the
// all-reduces run on the NCCL communicator's stream, ordered after the
// compute stream's gradient work by one CUDA event per bucket, and the
// compute stream waits for them with one more event at Finish: the host
// never blocks. On the host they run on a goroutine, in bucket order.
//
//	dp, err := worker.NewDataParallel(ctx, c, sizes, grads, worker.DataParallelConfig{Stream: stream})
//	err = dp.BroadcastParams(ctx, params) // every rank starts from rank 0's weights
//	for step := ... {
//		for i := last; i >= 0; i-- { // backward
//			... write the gradient of parameter i into dp.Grad(i) ...
//			err = dp.Ready(ctx, i)
//		}
//		if synced, err := dp.Finish(ctx); synced { ... optimizer step ... }
//	}
//
// AccumulationSteps k sums the gradients of k micro-steps locally (backward
// writes them on MicroStep 0 and adds to them after) and reduces once; the
// result is the mean over k × ranks. BF16 halves the bytes on the wire:
// gradients are rounded to bfloat16, summed in bfloat16 and scaled back into
// float32 (RoundBF16 shows the rounding).
//
// AfterReduce runs per bucket right after its reduction (the optimizer step
// of the bucket's parameters), so backward must not read a parameter after
// marking it Ready. DeferUpdate lifts that: a bucket's AfterReduce then also
// waits until backward has Released each of its parameters (Finish releases
// the rest), so a layer can compute its weight gradient first, mark it
// Ready, compute the input gradient that still reads the weight, and
// Release it; the weight's reduction overlaps that input gradient. The
// results are bitwise those of the plain order.
//
// Transport picks how device gradients travel. For two ranks of one node
// that can map each other's memory (the default TransportAuto then chooses
// it; anything else falls back to NCCL and logs why), TransportCopyEngine
// copies each bucket into an inbox in the peer GPU's memory with a copy
// engine and adds the two there (package pairreduce): no SM is busy with
// communication while backward's GEMMs run, where NCCL's all-reduce keeps
// up to 24 CTAs resident and slowed them by up to 45 % on 2 × H200. With
// FusedSum the optimizer (AfterReduce) adds the peer's copy as it reads
// the gradients (Bucket.Peer), saving a pass over them. Both ranks compute
// own + peer's, so their weights stay bitwise equal. Past two ranks of one
// node, TransportCopyEngine (and TransportAuto where two ranks share a GPU)
// reduce-scatters and all-gathers chunks over the copy engines instead
// (package nodereduce; FusedSum does not apply). NewDataParallel and Close
// are collective on that path.
//
// On the NCCL backend, NewComm's options tune the communication stream:
// WithHighPriorityStream (its kernels take SMs ahead of compute kernels) and
// WithNCCLCTAs (bounds on the CTAs of each NCCL kernel).
//
// # Errors
//
// Errors a program can match: ErrNotLaunched (not started by gotrain),
// ErrGenerationEnded (a rank failed and the job restarts it: return, or use
// Run), ErrNoState (nothing to restore), and CopyEngineUnavailableError
// (ErrCopyEngineUnavailable) when TransportCopyEngine cannot be had:
//
//	dp, err := worker.NewDataParallel(ctx, c, sizes, grads, cfg)
//	var un *worker.CopyEngineUnavailableError
//	if errors.As(err, &un) {
//		log.Printf("rank %d: no copy-engine transport (%s): falling back to NCCL", un.Rank, un.Reason)
//		cfg.Transport = worker.TransportNCCL
//		dp, err = worker.NewDataParallel(ctx, c, sizes, grads, cfg)
//	}
package worker
