// Package pairreduce averages a float32 gradient buffer between the two GPUs
// of a two-rank job on one node with the GPUs' copy engines instead of
// NCCL's kernels. Each rank copies a bucket of its gradients into an inbox
// in the other GPU's memory (cuMemcpyDtoDAsync over NVLink or PCIe peer to
// peer: a copy engine, no SM), raises a flag there (cuStreamWriteValue32),
// and once the peer's copy has arrived (cuStreamWaitValue32 on its own
// flag) adds the two with one small kernel, g = (g + inbox) / 2. For two
// ranks that moves the same bytes as NCCL's ring all-reduce, but the SMs
// are needed only for the addition: NCCL keeps up to 24 CTAs resident for
// the whole transfer, and on 2 × H200 they slowed the backward GEMMs they
// overlap by up to 45 % (bench/results/mlp-trace-2026-11-30.txt).
//
// It is written here because no library offers it: NCCL has no all-reduce
// without CTAs (its zero-CTA mode covers copies only, on symmetric
// windows, from 2.28 on), and Go has no CUDA IPC binding.
//
// Flags are per bucket and count steps, so nothing is reset between steps:
// a rank's copy of bucket b for step s waits until the peer has consumed
// bucket b of step s-1 (its inbox is free), and its addition waits until
// the peer's copy of step s has arrived. Both ranks compute own + peer's,
// the same two numbers (IEEE addition is commutative), so their gradients
// stay bitwise identical.
package pairreduce

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

// pairPTX is kernels/pair.cu compiled by `make ptx`.
//
//go:embed kernels/pair.ptx
var pairPTX string

// Pair is one rank's side of the reduction. Its methods other than Open
// and Release run on the thread where the device's context is current (the
// do function Open was given) and enqueue without waiting.
type Pair struct {
	rank, buckets int

	own      peermem.Local     // inbox, then the flags: arrived[buckets], consumed[buckets]
	peer     cudadrv.DevicePtr // the peer's allocation, mapped here
	mapped   bool              // peer came from IPCOpenMemHandle (else a pointer of this process)
	retained *cudadrv.Device   // the peer's device, whose primary context we retained

	// With more than one lane each copy is split over the lanes' streams,
	// which the driver may give to several copy engines. On 2 × H200 one
	// engine already moves 358 GB/s (NV18; 345 each way with both ways at
	// once) and more lanes were slower (BenchmarkGPUPeerCopy).
	lanes  []cudadrv.Stream
	forkEv cudadrv.Event
	joinEv []cudadrv.Event

	step atomic.Uint32 // the step being reduced, from 1
}

// record is what a rank tells its peer: how to map its allocation and where
// it runs.
type record struct {
	handle  cudadrv.IPCMemHandle
	ptr     uint64
	node    uint64 // hash of host name and boot id
	process uint64
	busID   string
}

const (
	recordBytes = 64 + 8 + 8 + 8 + 24
	busIDBytes  = 24
)

func (r record) place() peermem.Place {
	return peermem.Place{Node: r.node, Process: r.process, BusID: r.busID}
}

func (r record) encode() []int32 {
	b := make([]byte, 0, recordBytes)
	b = append(b, r.handle[:]...)
	b = binary.LittleEndian.AppendUint64(b, r.ptr)
	b = binary.LittleEndian.AppendUint64(b, r.node)
	b = binary.LittleEndian.AppendUint64(b, r.process)
	var bus [busIDBytes]byte
	copy(bus[:], r.busID)
	b = append(b, bus[:]...)
	return peermem.Words(b)
}

func decode(w []int32) record {
	b := peermem.Bytes(w)
	var r record
	copy(r.handle[:], b[:64])
	r.ptr = binary.LittleEndian.Uint64(b[64:])
	r.node = binary.LittleEndian.Uint64(b[72:])
	r.process = binary.LittleEndian.Uint64(b[80:])
	r.busID = strings.TrimRight(string(b[88:88+busIDBytes]), "\x00")
	return r
}

// DefaultLanes is how many copies a bucket's copy is split into when
// Config.Lanes is 0: one, the fastest on 2 × H200.
const DefaultLanes = 1

// Config sizes a Pair.
type Config struct {
	Elements int // float32 elements of the gradient buffer
	Buckets  int // buckets it is reduced in (each has its own flags)
	Lanes    int // streams a bucket's copy is split over (0: DefaultLanes)
}

// Open sets up rank c.Rank()'s side of the reduction of a gradient buffer
// of elements float32 in buckets buckets: an inbox as large in device
// memory, mapped by the peer. It is collective: both ranks of c (which must
// have two) call it. do runs a function on the thread where the device's
// context is current. A *peermem.UnavailableError means the peer's memory cannot
// be mapped (another node, a GPU this process does not see, no peer path):
// reduce with NCCL instead.
func Open(ctx context.Context, c comm.Comm, do func(func() error) error, cfg Config) (*Pair, error) {
	if c.Size() != 2 {
		return nil, peermem.Unavailable("pairreduce", c.Rank(), fmt.Sprintf("it needs exactly 2 ranks, the communicator has %d", c.Size()))
	}
	elements, buckets := cfg.Elements, cfg.Buckets
	if elements <= 0 || buckets <= 0 || cfg.Lanes < 0 {
		return nil, fmt.Errorf("pairreduce: %d elements in %d buckets over %d lanes", elements, buckets, cfg.Lanes)
	}
	if cfg.Lanes == 0 {
		cfg.Lanes = DefaultLanes
	}
	p := &Pair{rank: c.Rank(), buckets: buckets}
	p.step.Store(1)
	var mine record
	var dev cudadrv.Device
	err := do(func() (err error) {
		dev, err = p.setup(elements, cfg.Lanes, &mine)
		return err
	})
	if err != nil {
		p.free(do)
		return nil, fmt.Errorf("pairreduce: rank %d: %w", p.rank, err)
	}
	mine.ptr, mine.node, mine.process = uint64(p.own.Alloc), peermem.NodeID(), peermem.ProcessID
	if err := p.connect(ctx, c, do, dev, mine); err != nil {
		return nil, err
	}
	return p, nil
}

// setup, on the device's thread, sets up this rank's inbox, flags and
// kernel, fills in this rank's record but for ptr, node and process, and
// creates the lanes. It returns the current device.
func (p *Pair) setup(elements, lanes int, mine *record) (dev cudadrv.Device, err error) {
	if dev, err = p.own.SetUp(4*elements, 2*p.buckets, pairPTX, "pair_sum", "pair"); err != nil {
		return dev, err
	}
	mine.handle, mine.busID = p.own.Handle, p.own.BusID
	if lanes == 1 {
		return dev, nil
	}
	return dev, p.createLanes(lanes)
}

// createLanes creates the streams a copy is split over and their events.
func (p *Pair) createLanes(lanes int) error {
	var err error
	if p.forkEv, err = cudadrv.NewEvent(cudadrv.EventDisableTiming); err != nil {
		return err
	}
	for range lanes {
		s, err := cudadrv.NewStream(cudadrv.StreamNonBlocking)
		if err != nil {
			return err
		}
		p.lanes = append(p.lanes, s)
		ev, err := cudadrv.NewEvent(cudadrv.EventDisableTiming)
		if err != nil {
			return err
		}
		p.joinEv = append(p.joinEv, ev)
	}
	return nil
}

// connect exchanges the ranks' records, maps the peer's inbox and has both
// ranks agree that each could; on failure it frees this rank's side.
func (p *Pair) connect(ctx context.Context, c comm.Comm, do func(func() error) error, dev cudadrv.Device, mine record) error {
	recs, err := peermem.Exchange(ctx, c, mine.encode())
	if err != nil {
		p.free(do)
		return fmt.Errorf("pairreduce: rank %d: %w", p.rank, err)
	}
	peerRank := 1 - p.rank
	peer := decode(recs[peerRank])
	reason := ""
	if err := do(func() error { reason = p.mapPeer(dev, peer, mine, peerRank); return nil }); err != nil {
		reason = err.Error()
	}
	ok, err := peermem.Agree(ctx, c, reason)
	if err != nil {
		p.free(do)
		return fmt.Errorf("pairreduce: rank %d: %w", p.rank, err)
	}
	if !ok {
		p.free(do)
		if reason == "" {
			reason = fmt.Sprintf("rank %d cannot map this rank's memory", peerRank)
		}
		return peermem.Unavailable("pairreduce", p.rank, reason)
	}
	return nil
}

// mapPeer maps the peer's allocation, or says why it cannot.
func (p *Pair) mapPeer(dev cudadrv.Device, peer, mine record, peerRank int) string {
	peerDev, reason := peermem.PeerDevice(dev, mine.place(), peer.place(), peerRank)
	if reason != "" {
		return reason
	}
	if peer.process == mine.process {
		if peerDev != dev {
			retained, reason := peermem.EnablePeer(peerDev, peer.busID)
			if retained {
				p.retained = &peerDev
			}
			if reason != "" {
				return reason
			}
		}
		p.peer = cudadrv.DevicePtr(peer.ptr)
		return ""
	}
	ptr, err := cudadrv.IPCOpenMemHandle(peer.handle)
	if err != nil {
		return fmt.Sprintf("map rank %d's memory on GPU %s: %v", peerRank, peer.busID, err)
	}
	p.peer, p.mapped = ptr, true
	return ""
}

// The flags, as uint32 counters of steps: arrived[b] is raised by the
// peer when its copy of bucket b is in this rank's inbox, consumed[b] when
// the peer has added this rank's copy from its inbox.
func (p *Pair) arrived(base cudadrv.DevicePtr, b int) cudadrv.DevicePtr {
	return base + cudadrv.DevicePtr(p.own.FlagsOff+4*b)
}

func (p *Pair) consumed(base cudadrv.DevicePtr, b int) cudadrv.DevicePtr {
	return base + cudadrv.DevicePtr(p.own.FlagsOff+4*(p.buckets+b))
}

// Send enqueues on stream s (a CUstream) the copy of elements [off, off+n)
// of grads (a CUdeviceptr) into the same range of the peer's inbox, once the
// peer has consumed bucket b of the previous step, then raises the peer's
// arrived flag of b. grads must not change until the copy is done (an event
// recorded on s after Send).
func (p *Pair) Send(b, off, n int, grads, stream uintptr) error {
	return p.send(b, off, n, cudadrv.DevicePtr(grads), cudadrv.Stream(stream))
}

func (p *Pair) send(b, off, n int, grads cudadrv.DevicePtr, s cudadrv.Stream) error {
	step := p.step.Load()
	if err := s.WaitValue32(p.consumed(p.own.Alloc, b), step-1); err != nil {
		return err
	}
	if err := p.copyOut(off, n, grads, s); err != nil {
		return err
	}
	return s.WriteValue32(p.arrived(p.peer, b), step)
}

// copyOut copies elements [off, off+n) of grads to the peer's inbox, split
// over the lanes, and has s wait for all of them.
func (p *Pair) copyOut(off, n int, grads cudadrv.DevicePtr, s cudadrv.Stream) error {
	at := func(i int) cudadrv.DevicePtr { return cudadrv.DevicePtr(4 * (off + i)) }
	// Pieces of whole 256-byte lines, and none of less than 1 MiB.
	const align, least = 64, 256 << 10
	if len(p.lanes) == 0 || n < 2*least {
		return cudadrv.CopyDeviceToDeviceAsync(p.peer+at(0), grads+at(0), 4*n, s)
	}
	piece := max((n/len(p.lanes)+align-1)&^(align-1), least)
	if err := p.forkEv.Record(s); err != nil {
		return err
	}
	for i, ls := range p.lanes {
		from := i * piece
		if from >= n {
			break
		}
		k := min(piece, n-from)
		if err := ls.WaitEvent(p.forkEv); err != nil {
			return err
		}
		if err := cudadrv.CopyDeviceToDeviceAsync(p.peer+at(from), grads+at(from), 4*k, ls); err != nil {
			return err
		}
		if err := p.joinEv[i].Record(ls); err != nil {
			return err
		}
		if err := s.WaitEvent(p.joinEv[i]); err != nil {
			return err
		}
	}
	return nil
}

// Sum enqueues on stream s (a CUstream), once the peer's bucket b of this
// step has arrived, grads[off:off+n] = (grads + inbox) × scale (grads a
// CUdeviceptr), then tells the peer that its copy has been consumed.
func (p *Pair) Sum(b, off, n int, grads uintptr, scale float32, stream uintptr) error {
	return p.sumInto(b, off, n, cudadrv.DevicePtr(grads), scale, cudadrv.Stream(stream))
}

func (p *Pair) sumInto(b, off, n int, grads cudadrv.DevicePtr, scale float32, s cudadrv.Stream) error {
	if err := p.waitArrived(b, s); err != nil {
		return err
	}
	const block = 256
	grid := min((n/4+block-1)/block, 4*p.own.SMs)
	at := cudadrv.DevicePtr(4 * off)
	err := p.own.Kernel.Launch(cudadrv.Dim3{X: uint32(max(grid, 1))}, cudadrv.Dim3{X: block}, 0, s,
		grads+at, p.own.Alloc+at, int64(n), scale)
	if err != nil {
		return err
	}
	return p.signalConsumed(b, s)
}

// Arrived makes the work enqueued on stream s (a CUstream) from now on wait
// until the peer's copy of bucket b of this step is in the inbox: for a
// caller that reads the inbox itself instead of calling Sum (an optimizer
// that adds the two as it reads them), and then calls Consumed.
func (p *Pair) Arrived(b int, stream uintptr) error {
	return p.waitArrived(b, cudadrv.Stream(stream))
}

func (p *Pair) waitArrived(b int, s cudadrv.Stream) error {
	return s.WaitValue32(p.arrived(p.own.Alloc, b), p.step.Load())
}

// Consumed tells the peer, once the work enqueued on stream s (a CUstream)
// so far is done, that its copy of bucket b has been read and the inbox may
// take the next step's.
func (p *Pair) Consumed(b int, stream uintptr) error {
	return p.signalConsumed(b, cudadrv.Stream(stream))
}

func (p *Pair) signalConsumed(b int, s cudadrv.Stream) error {
	return s.WriteValue32(p.consumed(p.peer, b), p.step.Load())
}

// Inbox returns where the peer's copy of element off of the gradient
// buffer arrives, in this GPU's memory (a CUdeviceptr).
func (p *Pair) Inbox(off int) uintptr { return uintptr(p.own.Alloc + cudadrv.DevicePtr(4*off)) }

// Next ends a step: later Sends and Sums belong to the next one.
func (p *Pair) Next() { p.step.Add(1) }

// Release lets every stream waiting on this rank's flags go on, as if the
// peer had done its part for a billion steps: for an abort, when the peer
// is gone. The sums that then run add whatever the inbox holds. It runs on
// a thread of its own (the device's thread may be the one waiting) and can
// be called from any goroutine.
func (p *Pair) Release() {
	p.own.Release(func() []cudadrv.DevicePtr {
		var flags []cudadrv.DevicePtr
		for b := range p.buckets {
			flags = append(flags, p.arrived(p.own.Alloc, b), p.consumed(p.own.Alloc, b))
		}
		return flags
	}, p.step.Load()+1<<30)
}

// Close unmaps the peer's memory and frees this rank's. Call it through
// do once neither rank will write into the other's memory again (both
// ranks' streams done).
func (p *Pair) Close() error {
	p.own.Closing()
	var errs []error
	for i, ls := range p.lanes {
		errs = append(errs, ls.Synchronize(), ls.Destroy(), p.joinEv[i].Destroy())
	}
	if p.forkEv != 0 {
		errs = append(errs, p.forkEv.Destroy())
	}
	p.lanes, p.joinEv, p.forkEv = nil, nil, 0
	if p.mapped {
		errs = append(errs, cudadrv.IPCCloseMemHandle(p.peer))
	}
	if p.retained != nil {
		errs = append(errs, p.retained.ReleasePrimaryContext())
	}
	errs = append(errs, p.own.Close())
	p.mapped, p.retained = false, nil
	return errors.Join(errs...)
}

func (p *Pair) free(do func(func() error) error) { _ = do(p.Close) }
