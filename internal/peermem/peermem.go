// Package peermem holds what the copy-engine transports (worker/pairreduce,
// worker/nodereduce) share about ranks that map each other's device
// memory: which boot of which machine and which process a rank runs in
// (ranks of one node can share memory through CUDA IPC, ranks of one
// process share pointers); a rank's own side (Local: the inbox and flags
// allocation, exported for IPC, and the sum kernel); the exchange of the
// ranks' records and their agreement that every rank could map the others
// (Exchange, Agree); whether one rank can address another's GPU
// (PeerDevice, EnablePeer); and raising a set of stream flags from a
// thread of its own, for an abort (WriteFlags, Local.Release).
package peermem

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"runtime"

	"github.com/gotrain/gotrain/gpu/cudadrv"
)

// ProcessID tells ranks of one process (tests, or a program driving
// several GPUs) from ranks of several: the first share pointers directly,
// the second map each other's memory through CUDA IPC, which cannot open a
// process's own handles.
var ProcessID = rand.Uint64()

// NodeID identifies this boot of this machine: ranks with equal ids can
// share device memory.
func NodeID() uint64 {
	h := fnv.New64a()
	host, _ := os.Hostname()
	h.Write([]byte(host))
	if boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.Write(boot)
	}
	return h.Sum64()
}

// WriteFlags writes v to each 32-bit flag in device memory from a new
// stream in ctx, on a thread of its own (the caller's device thread may be
// the one whose streams wait on them), and returns once the writes are
// done, so that the memory may then be freed. Errors are dropped: it runs
// when a peer is gone, and a failed write leaves a stream waiting, which
// the caller's own timeout then reports.
func WriteFlags(ctx cudadrv.Context, flags []cudadrv.DevicePtr, v uint32) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread is never unlocked: it ends with the goroutine, and
		// the context current on it with it.
		runtime.LockOSThread()
		if ctx.SetCurrent() != nil {
			return
		}
		s, err := cudadrv.NewStream(cudadrv.StreamNonBlocking)
		if err != nil {
			return
		}
		for _, f := range flags {
			_ = s.WriteValue32(f, v)
		}
		_ = s.Synchronize()
		_ = s.Destroy()
	}()
	<-done
}

// UnavailableError is a copy-engine transport's answer to Open when its
// ranks cannot map each other's memory (another node, one rank, no peer
// access); the caller reduces with NCCL instead. Every rank gets one.
type UnavailableError struct {
	Transport string // the package that answers, e.g. "nodereduce"
	Rank      int    // the rank that reports it
	Reason    string // why, e.g. "rank 3 is on another node"
}

// ErrUnavailable is what every UnavailableError unwraps to.
var ErrUnavailable = errors.New("the copy-engine reduction is not available")

// Unwrap makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Unwrap() error { return ErrUnavailable }

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s: rank %d: the copy-engine reduction is not available: %s", e.Transport, e.Rank, e.Reason)
}

// Unavailable is the UnavailableError of transport's rank for reason.
func Unavailable(transport string, rank int, reason string) *UnavailableError {
	return &UnavailableError{Transport: transport, Rank: rank, Reason: reason}
}
