// Package ncclcomm is gotrain's NCCL backend: it implements comm.Comm with
// NCCL collectives on one GPU per process. `gotrain launch --backend nccl`
// gives each worker its GPU; worker.NewComm picks this package then.
//
// # Usage
//
//	c, err := ncclcomm.New(ctx, ncclcomm.Config{
//		Name: "default", Generation: gen, Rank: rank, Size: size,
//		Device: ncclcomm.DeviceFor(gpu, os.Getenv), Store: store, Logger: log,
//	})
//	if err != nil { ... } // names the rank; says what is missing (driver, NCCL, GPU)
//	defer c.Close()
//	// device memory: no copies
//	err = c.AllReduce(ctx, comm.Device(ptr, n, comm.Float32), comm.Device(ptr, n, comm.Float32), comm.Sum)
//	// host memory (CPU-math programs): staged through device memory
//	err = c.AllReduce(ctx, comm.Host(grads), comm.Host(grads), comm.Avg)
//
// # Rendezvous
//
// Rank 0 calls ncclGetUniqueId and Puts the 128 bytes under
// IDKey(name, generation) ("ncclcomm/<name>/<gen>/id") in the Store; the other
// ranks Get it. The ranks first create a non-blocking communicator
// (ncclCommInitRankConfig), polled until ready, so a rank that never arrives
// cannot hang New past its context; then they split a blocking communicator
// off it for the collectives (NCCL launches every non-blocking collective on a
// new thread, which would cost tens of microseconds each) and destroy the
// first. The first is created with splitShare=1, so the split shares its
// proxy, streams and connection buffers instead of making them again
// (Config.NoSplitShare, or NCCL_COMM_SPLIT_SHARE_RESOURCES=0, turns that off).
// The thread's CUDA setup runs while the unique id is exchanged, and
// Prewarm (which worker.Init calls) loads the driver, the primary context
// and NCCL in the background before New is called; Comm.Timings tells when
// each step finished. NCCL's own settings that gotrain defaults for its
// workers (NCCL_CUMEM_ENABLE=0: new communicators connect in ~10 ms
// instead of ~165 ms) are in env.go; the environment overrides them.
//
// # Threads
//
// CUDA's current context and NCCL's groups belong to an OS thread. Each Comm
// owns one goroutine locked to its OS thread, with the device's primary
// context current (the context the CUDA runtime, NCCL and PyTorch share) and
// the communicator's stream; every CUDA and NCCL call of the Comm runs there.
// Calls reach that thread through an atomic hand-off, polled for a few tens
// of microseconds before either side sleeps, so back-to-back calls cost well
// under a microsecond each instead of a futex wake-up (see internal/osthread).
// Do runs any function on the thread: several collectives back to back,
// events and copies on Stream.
//
// # Completion
//
// The collectives of comm.Comm return when the result is in recv: they poll
// the stream (as nccl-tests does) instead of synchronizing it, watching the
// context and NCCL's asynchronous error, and abort the communicator when
// either ends the wait, so a lost peer turns into an error, not a hang. The
// Async variants (AllReduceAsync, …) take device buffers, enqueue on Stream
// and return at once, for overlapping communication with computation;
// Synchronize waits for the stream. Abort, from any goroutine, breaks a hang.
package ncclcomm
