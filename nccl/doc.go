// Package nccl is gotrain's binding to NVIDIA's NCCL, the data plane of the
// GPU backend. It is the only package with NCCL C code.
//
// NCCL is not linked: Load dlopens libnccl.so.2 at run time, so gotrain
// builds without NCCL or CUDA headers and starts on machines without GPUs.
// The C declarations in shim.h are gotrain's own, written against NCCL's
// documented ABI; every call is one cgo call through a function pointer that
// dlsym resolved, with no allocation on the path of a collective.
//
// Load looks in $GOTRAIN_NCCL_LIBRARY, then the dynamic loader's path, then
// Python's nvidia-nccl wheels; when nothing is found its error lists every
// place it looked and says how to install NCCL. NCCL 2.7 is the oldest it
// accepts. Functions that later releases added (ncclGetLastError 2.13,
// ncclCommInitRankConfig and ncclCommFinalize 2.14, ncclCommSplit 2.18,
// ncclCommInitRankScalable 2.23, ncclCommShrink 2.27, ncclCommRevoke,
// ncclCommGetUniqueId and ncclCommGrow 2.29) are optional: calling one that
// the loaded library lacks returns a *MissingError naming the release that
// added it (Library.Has tells beforehand, for a fallback).
// Every NCCL failure is an *Error carrying ncclGetErrorString and
// ncclGetLastError; errors.Is(err, nccl.InProgress) and the like test its
// Result.
//
// # Threads
//
// NCCL, like CUDA, keeps per-thread state: the current CUDA context picks the
// device of InitRank, and a group (GroupStart … GroupEnd) belongs to the OS
// thread that opened it. Goroutines move between threads, so lock the
// goroutine to its thread (runtime.LockOSThread) while it makes a device's
// context current and calls NCCL; Group does that for a group.
//
// # Recovery without a new unique id
//
// After a rank dies, the survivors stop the communicator's work with Revoke
// (or Shrink with ShrinkAbort) and Shrink it to themselves; a replacement
// joins with Grow (the survivors) and JoinGrow (the new rank), using the id
// one survivor gets from GrowID. The parent of such a shrink is aborted,
// never destroyed (Destroy aborts it). bench/shrinkgrow measures this
// against re-init; bench/results/shrink-grow-2026-12-02.md has the numbers.
//
// # Usage
//
//	lib, err := nccl.Load()
//	if err != nil {
//		return err // says where it looked and what to install
//	}
//	// rank 0: id, _ := lib.GetUniqueID(); publish id[:] to the other ranks.
//	// On a thread locked with the device's context current:
//	c, err := lib.InitRank(worldSize, id, rank)
//	if err != nil {
//		return err
//	}
//	defer c.Destroy()
//	err = c.AllReduce(sendPtr, recvPtr, n, nccl.Float32, nccl.Sum, stream)
//	// then synchronize stream (package gpu/cudadrv, or the user's CUDA code)
package nccl
