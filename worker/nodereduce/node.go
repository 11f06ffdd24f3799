// Package nodereduce averages a float32 gradient buffer over the N ranks
// of one node with the GPUs' copy engines instead of NCCL's kernels: the
// generalisation of package pairreduce past two ranks.
//
// Each bucket is cut into N chunks, chunk k owned by rank k. Reduce-scatter:
// every rank copies chunk k of its gradients into slot r of rank k's inbox
// (cuMemcpyDtoDAsync: a copy engine, no SM) and raises a flag there
// (cuStreamWriteValue32). Once the other N-1 copies of its chunk have
// arrived (cuStreamWaitValue32 on its own flags), rank k adds them with one
// small kernel, in rank order, and scales. All-gather: rank k copies the
// result into chunk k of every other rank's gradient buffer, mapped through
// CUDA IPC, and raises a flag there. Every rank ends with the owner's bits
// of each chunk, so all ranks agree bitwise. Each rank moves 2(N-1)/N of
// the buffer, as NCCL's ring does, but the SMs only run the addition.
//
// The case it is for: several ranks on one GPU (NCCL ≥ 2.30's
// multi-rank-per-GPU). Without MPS their processes' kernels run in turns
// of time slices, and an NCCL collective, whose kernels spin until every
// rank's have run, costs tens of milliseconds whatever its size. Here no
// kernel waits for another rank: the waits are in the streams (the GPU's
// front end), and the copies of all ranks run on the copy engines.
//
// Ranks in one process share one CUDA context, whose streams share CUDA's
// hardware work queues (8 unless CUDA_DEVICE_MAX_CONNECTIONS says more):
// give it at least as many as the ranks have streams, or a stream waiting
// for a flag can hold back the work that would raise it.
//
// Flags count steps, so nothing is reset between steps: rank r's copy of
// bucket b for step s into rank k's inbox waits until k has consumed r's
// copy of step s-1 (consumed flag, written by k into r's memory); k's
// addition waits until the N-1 copies of step s have arrived; the
// all-gather's copy into rank j's gradients follows j's own copy of that
// chunk to k (k's addition waited for it), so it never overwrites what j
// has yet to send.
package nodereduce

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/peermem"
	"github.com/gotrain/gotrain/worker/comm"
)

// nodePTX is kernels/node.cu's kernel (kernels/node.ptx).
//
//go:embed kernels/node.ptx
var nodePTX string

// Span is a bucket: Len float32 elements from element Offset of the
// gradient buffer.
type Span struct{ Offset, Len int }

// Config sizes a Node.
type Config struct {
	Grads   uintptr // the gradient buffer (a CUdeviceptr of cuMemAlloc'd memory, possibly inside a larger allocation)
	Buckets []Span  // reduced one at a time, in this order on every rank
	// SharedGPUOnly makes Open answer a peermem.UnavailableError unless two ranks
	// share a GPU, where NCCL's kernels take turns in time slices and the
	// copy engines win; on GPUs of their own NCCL has not been measured
	// against it.
	SharedGPUOnly bool
}

// align is the chunk granularity in elements: 256-byte lines.
const align = 64

// layout is where bucket b's chunks and inbox slots are, the same on
// every rank.
type layout struct {
	ranks    int
	chunk    []int // elements per chunk of bucket b (the last ones may be shorter or empty)
	inboxOff []int // element offset of bucket b's slots in the inbox
	inboxLen int   // elements of the inbox
}

func newLayout(ranks int, buckets []Span) layout {
	l := layout{ranks: ranks, chunk: make([]int, len(buckets)), inboxOff: make([]int, len(buckets))}
	for b, bk := range buckets {
		c := (bk.Len + ranks - 1) / ranks
		c = (c + align - 1) / align * align
		l.chunk[b] = c
		l.inboxOff[b] = l.inboxLen
		l.inboxLen += ranks * c
	}
	return l
}

// part returns the element range [from, from+n) of bucket bk that rank k
// owns, relative to the gradient buffer.
func (l layout) part(b int, bk Span, k int) (from, n int) {
	c := l.chunk[b]
	lo := min(k*c, bk.Len)
	hi := min(lo+c, bk.Len)
	return bk.Offset + lo, hi - lo
}

// slot returns the element offset in an inbox of rank j's copy of bucket b.
func (l layout) slot(b, j int) int { return l.inboxOff[b] + j*l.chunk[b] }

// Node is one rank's side of the reduction. Its methods other than Open
// and Release run on the thread where the device's context is current (the
// do function Open was given) and enqueue without waiting.
type Node struct {
	rank, size int
	buckets    []Span
	l          layout
	grads      cudadrv.DevicePtr

	own      peermem.Local    // inbox, then the flags
	peers    []peer           // by rank; this rank's entry is its own memory
	retained []cudadrv.Device // peers' devices whose primary context we retained

	step atomic.Uint32 // the step being reduced, from 1
}

// peer is another rank's memory as this rank addresses it.
type peer struct {
	alloc, grads cudadrv.DevicePtr
	allocMapped  bool              // alloc came from IPCOpenMemHandle
	gradsMapped  cudadrv.DevicePtr // the mapped base of the peer's gradient allocation, or 0
}

// Flags, uint32 step counters in each rank's allocation, three per bucket
// and rank j: arrived (j's copy of this rank's chunk is in the inbox),
// gathered (j's reduced chunk is in this rank's gradients), consumed (j has
// added this rank's copy from j's inbox, which may take the next step's).
const (
	arrivedFlag = iota
	gatheredFlag
	consumedFlag
	flagKinds
)

func (n *Node) flag(base cudadrv.DevicePtr, kind, b, j int) cudadrv.DevicePtr {
	return base + cudadrv.DevicePtr(n.own.FlagsOff+4*((kind*len(n.buckets)+b)*n.size+j))
}

// record is what a rank tells the others: how to map its inbox and its
// gradients, and where it runs.
type record struct {
	inbox, grads        cudadrv.IPCMemHandle
	inboxPtr, gradsBase uint64
	gradsOff            uint64
	node, process       uint64
	busID               string
	gradsErr            bool // its gradients cannot be shared (not cuMemAlloc memory)
}

const (
	busIDBytes  = 24
	recordBytes = 64 + 64 + 8*5 + busIDBytes + 8
)

func (r record) place() peermem.Place {
	return peermem.Place{Node: r.node, Process: r.process, BusID: r.busID}
}

func (r record) encode() []int32 {
	b := make([]byte, 0, recordBytes)
	b = append(b, r.inbox[:]...)
	b = append(b, r.grads[:]...)
	for _, v := range []uint64{r.inboxPtr, r.gradsBase, r.gradsOff, r.node, r.process} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	var bus [busIDBytes]byte
	copy(bus[:], r.busID)
	b = append(b, bus[:]...)
	var e uint64
	if r.gradsErr {
		e = 1
	}
	b = binary.LittleEndian.AppendUint64(b, e)
	return peermem.Words(b)
}

func decode(w []int32) record {
	b := peermem.Bytes(w)
	var r record
	copy(r.inbox[:], b[:64])
	copy(r.grads[:], b[64:128])
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[128+8*i:]) }
	r.inboxPtr, r.gradsBase, r.gradsOff, r.node, r.process = u(0), u(1), u(2), u(3), u(4)
	r.busID = strings.TrimRight(string(b[168:168+busIDBytes]), "\x00")
	r.gradsErr = binary.LittleEndian.Uint64(b[168+busIDBytes:]) != 0
	return r
}

// Open sets up rank c.Rank()'s side of the reduction: an inbox of about
// the gradient buffer's size in device memory, mapped by the other ranks,
// and the others' inboxes and gradient buffers mapped here. It is
// collective: every rank of c calls it with the same buckets. do runs a
// function on the thread where the device's context is current. An
// *peermem.UnavailableError means some rank cannot map another's memory (another
// node, a GPU this process does not see, no peer path, gradients that CUDA
// IPC cannot share): reduce with NCCL instead.
func Open(ctx context.Context, c comm.Comm, do func(func() error) error, cfg Config) (*Node, error) {
	size := c.Size()
	if size < 2 {
		return nil, peermem.Unavailable("nodereduce", c.Rank(), "one rank has nothing to reduce")
	}
	if cfg.Grads == 0 || len(cfg.Buckets) == 0 {
		return nil, fmt.Errorf("nodereduce: no gradients (%d buckets)", len(cfg.Buckets))
	}
	for b, bk := range cfg.Buckets {
		if bk.Offset < 0 || bk.Len <= 0 {
			return nil, fmt.Errorf("nodereduce: bucket %d is %d elements at %d", b, bk.Len, bk.Offset)
		}
	}
	n := &Node{rank: c.Rank(), size: size, buckets: cfg.Buckets, l: newLayout(size, cfg.Buckets), grads: cudadrv.DevicePtr(cfg.Grads)}
	n.step.Store(1)
	flags := flagKinds * len(cfg.Buckets) * size
	var mine record
	var dev cudadrv.Device
	err := do(func() (err error) {
		dev, err = n.setup(flags, &mine)
		return err
	})
	if err != nil {
		n.free(do)
		return nil, fmt.Errorf("nodereduce: rank %d: %w", n.rank, err)
	}
	mine.inboxPtr, mine.node, mine.process = uint64(n.own.Alloc), peermem.NodeID(), peermem.ProcessID
	if err := n.connect(ctx, c, do, dev, mine, cfg.SharedGPUOnly); err != nil {
		return nil, err
	}
	return n, nil
}

// setup, on the device's thread, sets up this rank's inbox, flags and
// kernel, and fills in this rank's record but for inboxPtr, node and
// process. It returns the current device.
func (n *Node) setup(flags int, mine *record) (dev cudadrv.Device, err error) {
	if dev, err = n.own.SetUp(4*n.l.inboxLen, flags, nodePTX, "node_sum", "node"); err != nil {
		return dev, err
	}
	mine.inbox, mine.busID = n.own.Handle, n.own.BusID
	// The gradients may sit inside a larger allocation: share that
	// and say where in it they start.
	if base, _, err := cudadrv.MemGetAddressRange(n.grads); err != nil {
		mine.gradsErr = true
	} else if mine.grads, err = cudadrv.IPCGetMemHandle(base); err != nil {
		mine.gradsErr = true
	} else {
		mine.gradsBase, mine.gradsOff = uint64(base), uint64(n.grads-base)
	}
	return dev, nil
}

// connect exchanges the ranks' records, maps the others' inboxes and
// gradients (with sharedGPUOnly, only where two ranks share a GPU) and has
// every rank agree that each could; on failure it frees this rank's side.
func (n *Node) connect(ctx context.Context, c comm.Comm, do func(func() error) error, dev cudadrv.Device, mine record, sharedGPUOnly bool) error {
	words, err := peermem.Exchange(ctx, c, mine.encode())
	if err != nil {
		n.free(do)
		return fmt.Errorf("nodereduce: rank %d: %w", n.rank, err)
	}
	recs := make([]record, n.size)
	for j := range recs {
		recs[j] = decode(words[j])
	}
	n.peers = make([]peer, n.size)
	reason := ""
	if sharedGPUOnly && !sharesGPU(recs) {
		reason = "every rank has a GPU of its own (the copy engines are taken only where ranks share one)"
	} else if err := do(func() error { reason = n.mapPeers(dev, recs); return nil }); err != nil {
		reason = err.Error()
	}
	ok, err := peermem.Agree(ctx, c, reason)
	if err != nil {
		n.free(do)
		return fmt.Errorf("nodereduce: rank %d: %w", n.rank, err)
	}
	if !ok {
		n.free(do)
		if reason == "" {
			reason = "another rank cannot map this rank's memory"
		}
		return peermem.Unavailable("nodereduce", n.rank, reason)
	}
	return nil
}

// sharesGPU reports whether two ranks of one node have the same GPU: the
// same answer on every rank, which sees the same records.
func sharesGPU(recs []record) bool {
	type gpu struct {
		node  uint64
		busID string
	}
	seen := map[gpu]bool{}
	for _, r := range recs {
		k := gpu{r.node, r.busID}
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}

// mapPeers maps every other rank's inbox and gradients, or says why it
// cannot.
func (n *Node) mapPeers(dev cudadrv.Device, recs []record) string {
	mine := recs[n.rank]
	n.peers[n.rank] = peer{alloc: n.own.Alloc, grads: n.grads}
	enabled := map[cudadrv.Device]bool{dev: true}
	for j, r := range recs {
		if j == n.rank {
			continue
		}
		if r.node == mine.node && r.gradsErr {
			return fmt.Sprintf("rank %d's gradients are not memory that CUDA IPC can share (cuMemAlloc)", j)
		}
		peerDev, reason := peermem.PeerDevice(dev, mine.place(), r.place(), j)
		if reason != "" {
			return reason
		}
		if r.process == mine.process {
			if !enabled[peerDev] {
				retained, reason := peermem.EnablePeer(peerDev, r.busID)
				if retained {
					n.retained = append(n.retained, peerDev)
				}
				if reason != "" {
					return reason
				}
				enabled[peerDev] = true
			}
			n.peers[j] = peer{alloc: cudadrv.DevicePtr(r.inboxPtr), grads: cudadrv.DevicePtr(r.gradsBase + r.gradsOff)}
			continue
		}
		inbox, err := cudadrv.IPCOpenMemHandle(r.inbox)
		if err != nil {
			return fmt.Sprintf("map rank %d's inbox on GPU %s: %v", j, r.busID, err)
		}
		n.peers[j].alloc, n.peers[j].allocMapped = inbox, true
		base, err := cudadrv.IPCOpenMemHandle(r.grads)
		if err != nil {
			return fmt.Sprintf("map rank %d's gradients on GPU %s: %v", j, r.busID, err)
		}
		n.peers[j].gradsMapped, n.peers[j].grads = base, base+cudadrv.DevicePtr(r.gradsOff)
	}
	return ""
}

// others calls f for every other rank, starting with the next one: ranks
// then write to different peers at the same moment.
func (n *Node) others(f func(k int) error) error {
	for t := 1; t < n.size; t++ {
		if err := f((n.rank + t) % n.size); err != nil {
			return err
		}
	}
	return nil
}

func at(p cudadrv.DevicePtr, elem int) cudadrv.DevicePtr { return p + cudadrv.DevicePtr(4*elem) }

// Send enqueues on stream s (a CUstream) the reduce-scatter copies of bucket b: chunk k of the
// gradients into this rank's slot of rank k's inbox, each once k has
// consumed the previous step's, then raises k's arrived flag. The chunks
// must not change until the copies are done (an event recorded on s after
// Send).
func (n *Node) Send(b int, stream uintptr) error {
	s := cudadrv.Stream(stream)
	step := n.step.Load()
	bk := n.buckets[b]
	return n.others(func(k int) error {
		if err := s.WaitValue32(n.flag(n.own.Alloc, consumedFlag, b, k), step-1); err != nil {
			return err
		}
		from, cnt := n.l.part(b, bk, k)
		if cnt > 0 {
			dst := at(n.peers[k].alloc, n.l.slot(b, n.rank))
			if err := cudadrv.CopyDeviceToDeviceAsync(dst, at(n.grads, from), 4*cnt, s); err != nil {
				return err
			}
		}
		return s.WriteValue32(n.flag(n.peers[k].alloc, arrivedFlag, b, n.rank), step)
	})
}

// Reduce enqueues on stream s (a CUstream), once the other ranks' copies of this rank's chunk
// of bucket b have arrived, its sum over the ranks × scale; tells each rank
// its copy has been consumed; copies the result into every other rank's
// gradients (all-gather); and makes s wait until every other rank's chunk
// of this step is in this rank's gradients. After it the whole bucket is
// reduced, the same bits on every rank.
func (n *Node) Reduce(b int, scale float32, stream uintptr) error {
	s := cudadrv.Stream(stream)
	step := n.step.Load()
	bk := n.buckets[b]
	if err := n.others(func(j int) error { return s.WaitValue32(n.flag(n.own.Alloc, arrivedFlag, b, j), step) }); err != nil {
		return err
	}
	from, cnt := n.l.part(b, bk, n.rank)
	if cnt > 0 {
		const block = 256
		grid := min((cnt+block-1)/block, 4*n.own.SMs)
		err := n.own.Kernel.Launch(cudadrv.Dim3{X: uint32(max(grid, 1))}, cudadrv.Dim3{X: block}, 0, s,
			at(n.grads, from), at(n.own.Alloc, n.l.slot(b, 0)), int64(n.l.chunk[b]), int32(n.size), int32(n.rank), int64(cnt), scale)
		if err != nil {
			return err
		}
	}
	err := n.others(func(j int) error {
		return s.WriteValue32(n.flag(n.peers[j].alloc, consumedFlag, b, n.rank), step)
	})
	if err != nil {
		return err
	}
	err = n.others(func(k int) error {
		if cnt > 0 {
			if err := cudadrv.CopyDeviceToDeviceAsync(at(n.peers[k].grads, from), at(n.grads, from), 4*cnt, s); err != nil {
				return err
			}
		}
		return s.WriteValue32(n.flag(n.peers[k].alloc, gatheredFlag, b, n.rank), step)
	})
	if err != nil {
		return err
	}
	return n.others(func(j int) error { return s.WaitValue32(n.flag(n.own.Alloc, gatheredFlag, b, j), step) })
}

// Next ends a step: later Sends and Reduces belong to the next one.
func (n *Node) Next() { n.step.Add(1) }

// Release lets every stream waiting on this rank's flags go on, as if the
// other ranks had done their part for a billion steps: for an abort, when a
// rank is gone. The sums that then run add whatever the inbox holds. It
// runs on a thread of its own (the device's thread may be the one waiting)
// and can be called from any goroutine.
func (n *Node) Release() {
	n.own.Release(func() []cudadrv.DevicePtr {
		var flags []cudadrv.DevicePtr
		for kind := range flagKinds {
			for b := range n.buckets {
				for j := range n.size {
					flags = append(flags, n.flag(n.own.Alloc, kind, b, j))
				}
			}
		}
		return flags
	}, n.step.Load()+1<<30)
}

// Close unmaps the other ranks' memory and frees this rank's. Call it
// through do once no rank will write into another's memory again (every
// rank's streams done).
func (n *Node) Close() error {
	n.own.Closing()
	var errs []error
	for j := range n.peers {
		p := &n.peers[j]
		if p.allocMapped {
			errs = append(errs, cudadrv.IPCCloseMemHandle(p.alloc))
		}
		if p.gradsMapped != 0 {
			errs = append(errs, cudadrv.IPCCloseMemHandle(p.gradsMapped))
		}
		*p = peer{}
	}
	for _, d := range n.retained {
		errs = append(errs, d.ReleasePrimaryContext())
	}
	n.retained = nil
	errs = append(errs, n.own.Close())
	return errors.Join(errs...)
}

func (n *Node) free(do func(func() error) error) { _ = do(n.Close) }
