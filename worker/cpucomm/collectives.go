package cpucomm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/gotrain/gotrain/worker/comm"
)

// ErrMismatch is wrapped by the error a collective returns when another rank
// issued a different collective (kind, sequence number, dtype, op, count or
// root) at the same point.
var ErrMismatch = errors.New("cpucomm: ranks issued different collectives")

// errAborted stops a sending goroutine whose receiving half failed; the
// receiving half's error is the one reported.
var errAborted = errors.New("cpucomm: aborted")

// AllReduce leaves op over every rank's send in every rank's recv; see comm.Comm.
func (c *Comm) AllReduce(ctx context.Context, send, recv comm.Buffer, op comm.Op) error {
	if err := checkPair(kindAllReduce, send, recv); err != nil {
		return err
	}
	if err := checkOp(kindAllReduce, op); err != nil {
		return err
	}
	if send.Len() != recv.Len() {
		return fmt.Errorf("cpucomm: allreduce: send holds %d elements but recv holds %d; they must be the same", send.Len(), recv.Len())
	}
	k := &call{kind: kindAllReduce, dtype: send.DType(), op: op, count: send.Len(), root: -1}
	return c.run(ctx, k, func() error { return c.allReduce(k, send.HostBytes(), recv.HostBytes()) })
}

// Broadcast copies root's buf into every other rank's buf.
func (c *Comm) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	if err := checkHost(kindBroadcast, buf); err != nil {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("cpucomm: broadcast: root %d is out of range for %d ranks (want 0..%d)", root, c.size, c.size-1)
	}
	k := &call{kind: kindBroadcast, dtype: buf.DType(), count: buf.Len(), root: root}
	return c.run(ctx, k, func() error { return c.broadcast(k, buf.HostBytes(), root) })
}

// AllGather concatenates every rank's send, in rank order, into recv.
func (c *Comm) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	if err := checkPair(kindAllGather, send, recv); err != nil {
		return err
	}
	if recv.Len() != c.size*send.Len() {
		return fmt.Errorf("cpucomm: allgather: recv holds %d elements, want %d (%d ranks × send's %d)", recv.Len(), c.size*send.Len(), c.size, send.Len())
	}
	k := &call{kind: kindAllGather, dtype: send.DType(), count: send.Len(), root: -1}
	return c.run(ctx, k, func() error { return c.allGather(k, send.HostBytes(), recv.HostBytes()) })
}

// ReduceScatter reduces send over every rank and leaves block Rank() of the
// result in recv. In place means recv is block Rank() of send.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv comm.Buffer, op comm.Op) error {
	if err := checkPair(kindReduceScatter, send, recv); err != nil {
		return err
	}
	if err := checkOp(kindReduceScatter, op); err != nil {
		return err
	}
	if send.Len() != c.size*recv.Len() {
		return fmt.Errorf("cpucomm: reducescatter: send holds %d elements, want %d (%d ranks × recv's %d)", send.Len(), c.size*recv.Len(), c.size, recv.Len())
	}
	k := &call{kind: kindReduceScatter, dtype: send.DType(), op: op, count: recv.Len(), root: -1}
	return c.run(ctx, k, func() error { return c.reduceScatter(k, send.HostBytes(), recv.HostBytes()) })
}

// Barrier returns when every rank has entered it: it is an all-reduce of one
// int32.
func (c *Comm) Barrier(ctx context.Context) error {
	k := &call{kind: kindBarrier, dtype: comm.Int32, op: comm.Sum, count: 1, root: -1}
	return c.run(ctx, k, func() error {
		if c.size == 1 {
			return nil
		}
		c.barrier[0] = 1
		b := comm.Host(c.barrier[:])
		return c.allReduceDirect(k, b.Slice(0, 1).HostBytes(), b.Slice(1, 2).HostBytes())
	})
}

func checkHost(k kind, b comm.Buffer) error {
	if b.OnDevice() {
		return fmt.Errorf("cpucomm: %s: the cpu backend works on host memory; use the nccl backend for device buffers", k)
	}
	if b.DType().Size() == 0 {
		return fmt.Errorf("cpucomm: %s: unsupported dtype %s (want float32, float64, int32 or int64)", k, b.DType())
	}
	return nil
}

func checkPair(k kind, send, recv comm.Buffer) error {
	if err := checkHost(k, send); err != nil {
		return err
	}
	if err := checkHost(k, recv); err != nil {
		return err
	}
	if send.DType() != recv.DType() {
		return fmt.Errorf("cpucomm: %s: send is %s but recv is %s; they must be the same dtype", k, send.DType(), recv.DType())
	}
	return nil
}

func checkOp(k kind, op comm.Op) error {
	if op < comm.Sum || op > comm.Min {
		return fmt.Errorf("cpucomm: %s: unknown op %s (want sum, avg, max or min)", k, op)
	}
	return nil
}

// run issues one collective: it checks the communicator, numbers the
// collective, arranges for ctx to abort it, and runs body. Any error breaks
// the communicator: the byte streams between ranks are out of step.
func (c *Comm) run(ctx context.Context, k *call, body func() error) error {
	c.mu.Lock()
	closed, failure := c.closed, c.failure
	c.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("cpucomm: %s: %w", k.kind, comm.ErrClosed)
	case failure != nil:
		return fmt.Errorf("cpucomm: %s: the communicator broke earlier; create a new one: %w", k.kind, failure)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cpucomm: %s: %w", k.kind, err)
	}
	c.seq++
	k.seq = c.seq
	k.encode()

	var stop func() bool
	if c.size > 1 && ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() {
			c.fail(fmt.Errorf("cpucomm: %s: %w", k.short(), ctx.Err()))
		})
	}
	err := body()
	if stop != nil && !stop() {
		return fmt.Errorf("cpucomm: %s: %w", k.short(), ctx.Err())
	}
	if err == nil {
		return nil
	}
	c.fail(err)
	if err = c.failed(); errors.Is(err, comm.ErrClosed) {
		return fmt.Errorf("cpucomm: %s: %w", k.short(), err)
	}
	return err
}

func (c *Comm) allReduce(k *call, send, recv []byte) error {
	switch {
	case c.size == 1:
		copy(recv, send) // Avg divides by 1
		return nil
	case len(send) == 0:
		return nil
	case len(send) <= c.directMax:
		return c.allReduceDirect(k, send, recv)
	}
	return c.allReduceRing(k, send, recv)
}

// allReduceDirect sends this rank's buffer to every other rank and reduces
// the P buffers locally in rank order, so every rank computes the same bits.
func (c *Comm) allReduceDirect(k *call, send, recv []byte) error {
	n := len(send)
	slots := c.scratchBytes(c.size * n)
	slot := func(p int) []byte { return slots[p*n : (p+1)*n] }
	own := slot(c.rank)
	copy(own, send) // send may be recv, which the reduction overwrites
	if err := c.exchange(k, func(int) []byte { return own }, slot); err != nil {
		return err
	}
	c.reduceSlots(k, recv, slot)
	return nil
}

// reduceSlots sets dst to op over slot(0), ..., slot(P-1), in that order.
func (c *Comm) reduceSlots(k *call, dst []byte, slot func(int) []byte) {
	reduceBytes(k.dtype, k.op, dst, slot(0), slot(1))
	for q := 2; q < c.size; q++ {
		reduceBytes(k.dtype, k.op, dst, dst, slot(q))
	}
	if k.op == comm.Avg {
		divideBytes(k.dtype, dst, c.size)
	}
}

// allReduceRing is reduce-scatter then all-gather around the ring
// 0 → 1 → … → P-1 → 0. The buffer is cut into P segments; segment i is
// reduced along the path i, i+1, …, i-1 (mod P), finished (and, for Avg,
// divided) by rank i-1, and then copied around the ring, so every rank ends
// with the bits that one rank computed.
func (c *Comm) allReduceRing(k *call, send, recv []byte) error {
	P, r := c.size, c.rank
	seg := segmenter(k.count, P, k.dtype.Size())
	steps := c.plan(2*P - 2)
	for s := 0; s < P-1; s++ {
		sl, sh := seg(mod(r-s, P))
		rl, rh := seg(mod(r-s-1, P))
		st := &steps[s]
		if s == 0 {
			st.send = send[sl:sh]
		} else {
			st.send, st.sendWaits = recv[sl:sh], true
		}
		st.reduce, st.dst, st.src = true, recv[rl:rh], send[rl:rh]
		st.divide = k.op == comm.Avg && s == P-2
		st.forward = true
	}
	for t := 0; t < P-1; t++ {
		sl, sh := seg(mod(r+1-t, P))
		rl, rh := seg(mod(r-t, P))
		st := &steps[P-1+t]
		st.send, st.sendWaits = recv[sl:sh], true
		st.recv = recv[rl:rh]
		st.forward = t < P-2
		// This segment went out at reduce-scatter step t. The bytes coming
		// back depend on it, so the send is over, but only the sending
		// goroutine's word makes that visible to the memory model.
		steps[t].announce = true
		st.afterSend = t + 1
	}
	return c.pipe(k, c.peers[mod(r-1, P)], c.peers[mod(r+1, P)], steps)
}

// segmenter returns the byte range of segment i when count elements of size
// es are cut into p nearly equal segments.
func segmenter(count, p, es int) func(i int) (int, int) {
	return func(i int) (int, int) { return i * count / p * es, (i + 1) * count / p * es }
}

func (c *Comm) broadcast(k *call, buf []byte, root int) error {
	P, r := c.size, c.rank
	switch {
	case P == 1 || len(buf) == 0:
		return nil
	case len(buf) <= c.directMax:
		if r != root {
			p := c.peers[root]
			if err := c.recvHeader(k, p); err != nil {
				return err
			}
			return c.recvFull(k, p, buf)
		}
		for i := 1; i < P; i++ {
			w := writer{k: k, p: c.peers[(root+i)%P], hdr: true}
			if err := w.write(buf); err != nil {
				return err
			}
		}
		return nil
	}
	// A pipelined chain root → root+1 → … → root-1: each rank forwards a
	// chunk as soon as it has it.
	pos := mod(r-root, P)
	var prev, next *peer
	steps := c.plan(1)
	if pos > 0 {
		prev = c.peers[mod(r-1, P)]
		steps[0].recv = buf
	}
	if pos < P-1 {
		next = c.peers[mod(r+1, P)]
		steps[0].send = buf
		steps[0].sendWaits = pos > 0
		steps[0].forward = pos > 0
	}
	return c.pipe(k, prev, next, steps)
}

func (c *Comm) allGather(k *call, send, recv []byte) error {
	P, r, n := c.size, c.rank, len(send)
	block := func(i int) []byte { return recv[i*n : (i+1)*n] }
	copy(block(r), send)
	switch {
	case P == 1 || n == 0:
		return nil
	case len(recv) <= c.directMax:
		own := block(r)
		return c.exchange(k, func(int) []byte { return own }, block)
	}
	// Ring: at step s, send the block received at step s-1 (own block at s = 0).
	steps := c.plan(P - 1)
	for s := 0; s < P-1; s++ {
		st := &steps[s]
		st.send, st.sendWaits = block(mod(r-s, P)), s > 0
		st.recv = block(mod(r-s-1, P))
		st.forward = s < P-2
	}
	return c.pipe(k, c.peers[mod(r-1, P)], c.peers[mod(r+1, P)], steps)
}

func (c *Comm) reduceScatter(k *call, send, recv []byte) error {
	P, r, n := c.size, c.rank, len(recv)
	block := func(i int) []byte { return send[i*n : (i+1)*n] }
	switch {
	case P == 1:
		copy(recv, send) // Avg divides by 1
		return nil
	case n == 0:
		return nil
	case len(send) <= c.directMax:
		// Send block p to rank p; reduce the P copies of our block in rank order.
		slots := c.scratchBytes(P * n)
		slot := func(p int) []byte { return slots[p*n : (p+1)*n] }
		copy(slot(r), block(r))
		if err := c.exchange(k, block, slot); err != nil {
			return err
		}
		c.reduceSlots(k, recv, slot)
		return nil
	}
	// Ring: block i starts at rank i+1 and ends, reduced, at rank i. The
	// partial sums in between live in scratch, one block per step.
	partials := c.scratchBytes((P - 2) * n)
	partial := func(s int) []byte { return partials[s*n : (s+1)*n] }
	steps := c.plan(P - 1)
	for s := 0; s < P-1; s++ {
		st := &steps[s]
		if s == 0 {
			st.send = block(mod(r-1, P))
		} else {
			st.send, st.sendWaits = partial(s-1), true
		}
		st.reduce, st.src = true, block(mod(r-s-2, P))
		if s == P-2 {
			st.dst, st.divide = recv, k.op == comm.Avg
		} else {
			st.dst, st.forward = partial(s), true
		}
	}
	return c.pipe(k, c.peers[mod(r-1, P)], c.peers[mod(r+1, P)], steps)
}

func mod(a, p int) int { return ((a % p) + p) % p }

// scratchBytes returns n bytes of the communicator's reusable scratch.
func (c *Comm) scratchBytes(n int) []byte {
	if len(c.scratch) < n {
		c.scratch = alignedBytes(n)
	}
	return c.scratch[:n]
}

// plan returns n zeroed steps from the communicator's reusable plan.
func (c *Comm) plan(n int) []step {
	if cap(c.steps) < n {
		c.steps = make([]step, n)
	}
	c.steps = c.steps[:n]
	clear(c.steps)
	return c.steps
}

// step is one step of a pipelined ring or chain: this rank sends send to the
// next rank and receives from the previous one, chunk by chunk, at the same
// time.
type step struct {
	send      []byte // what to send
	sendWaits bool   // send's chunks are the chunks that the receiving side forwards, so wait for each
	recv      []byte // where incoming bytes go when they are stored as they are
	reduce    bool   // incoming bytes are reduced instead: dst = src op incoming
	dst, src  []byte
	divide    bool // Avg: divide dst by the number of ranks after reducing
	forward   bool // a later send is what this step receives: release each chunk when done
	announce  bool // the sender reports each chunk of send once written
	afterSend int  // if > 0, receive chunk j only after step afterSend-1 reported sending its chunk j
	sentBase  int  // set by pipe: the index of this step's first report
}

func (st *step) incoming() int {
	if st.reduce {
		return len(st.dst)
	}
	return len(st.recv)
}

// pipe runs steps with a sending goroutine (to next) and this goroutine
// receiving (from prev). Each forwarded chunk passes through a token
// channel, so a rank sends chunk j of step s as soon as it has received and
// reduced chunk j of step s-1. Sending and receiving at once means no rank
// ever waits for its own socket buffers to drain. prev or next may be nil at
// the ends of a chain.
func (c *Comm) pipe(k *call, prev, next *peer, steps []step) error {
	es := k.dtype.Size()
	chunk := max(c.chunk/es*es, es)
	if len(c.in) < chunk {
		c.in = alignedBytes(chunk)
	}
	ntok, nsent := 0, 0
	for i := range steps {
		st := &steps[i]
		if st.forward {
			ntok += chunks(st.incoming(), chunk)
		}
		if st.announce {
			st.sentBase = nsent
			nsent += chunks(len(st.send), chunk)
		}
	}
	// Both channels hold every token they will ever carry, so neither side
	// blocks on sending one.
	tokens := make(chan struct{}, ntok)
	sent := make(chan struct{}, nsent)
	var done chan error
	if next != nil {
		done = make(chan error, 1)
		go func() { done <- c.pipeSend(k, next, steps, chunk, tokens, sent) }()
	}
	var err error
	if prev != nil {
		if err = c.pipeRecv(k, prev, steps, chunk, tokens, sent); err != nil {
			c.fail(err)
			close(tokens)
		}
	}
	if done != nil {
		if serr := <-done; err == nil || err == errAborted {
			err = serr
		}
	}
	return err
}

func chunks(n, chunk int) int { return (n + chunk - 1) / chunk }

func (c *Comm) pipeSend(k *call, p *peer, steps []step, chunk int, tokens <-chan struct{}, sent chan<- struct{}) error {
	defer close(sent)
	w := writer{k: k, p: p, hdr: true}
	fail := func(err error) error {
		c.fail(err)
		return err
	}
	if len(steps[0].send) == 0 || steps[0].sendWaits {
		if err := w.write(nil); err != nil {
			return fail(err)
		}
	}
	for i := range steps {
		st := &steps[i]
		for off := 0; off < len(st.send); off += chunk {
			if st.sendWaits {
				if _, ok := <-tokens; !ok {
					return errAborted
				}
			}
			if err := w.write(st.send[off:min(off+chunk, len(st.send))]); err != nil {
				return fail(err)
			}
			if st.announce {
				sent <- struct{}{}
			}
		}
	}
	return nil
}

func (c *Comm) pipeRecv(k *call, p *peer, steps []step, chunk int, tokens chan<- struct{}, sent <-chan struct{}) error {
	if err := c.recvHeader(k, p); err != nil {
		return err
	}
	reported := 0 // reports taken from sent
	for i := range steps {
		st := &steps[i]
		n := st.incoming()
		for j, off := 0, 0; off < n; j, off = j+1, off+chunk {
			end := min(off+chunk, n)
			if st.afterSend > 0 {
				for need := steps[st.afterSend-1].sentBase + j + 1; reported < need; reported++ {
					if _, ok := <-sent; !ok {
						return errAborted
					}
				}
			}
			if st.reduce {
				in := c.in[:end-off]
				if err := c.recvFull(k, p, in); err != nil {
					return err
				}
				dst := st.dst[off:end]
				reduceBytes(k.dtype, k.op, dst, st.src[off:end], in)
				if st.divide {
					divideBytes(k.dtype, dst, c.size)
				}
			} else if err := c.recvFull(k, p, st.recv[off:end]); err != nil {
				return err
			}
			if st.forward {
				tokens <- struct{}{}
			}
		}
	}
	return nil
}

// exchange sends sendTo(p) to every other rank p and receives
// len(recvInto(p)) bytes from each, sending from a goroutine while
// receiving here. In round i rank r sends to r+i and receives from r-i, so
// every send of round i meets a receive of round i and none can deadlock.
func (c *Comm) exchange(k *call, sendTo, recvInto func(p int) []byte) error {
	P, r := c.size, c.rank
	done := make(chan error, 1)
	go func() {
		for i := 1; i < P; i++ {
			p := c.peers[(r+i)%P]
			w := writer{k: k, p: p, hdr: true}
			if err := w.write(sendTo(p.rank)); err != nil {
				c.fail(err)
				done <- err
				return
			}
		}
		done <- nil
	}()
	var err error
	for i := 1; i < P && err == nil; i++ {
		p := c.peers[mod(r-i, P)]
		if err = c.recvHeader(k, p); err == nil {
			err = c.recvFull(k, p, recvInto(p.rank))
		}
	}
	if err != nil {
		c.fail(err)
	}
	if serr := <-done; err == nil {
		err = serr
	}
	return err
}

// writer sends a collective's bytes to one peer, the collective header first.
type writer struct {
	k   *call
	p   *peer
	hdr bool // the header is still to be sent
}

func (w *writer) write(b []byte) error {
	var err error
	if w.hdr {
		w.hdr = false
		bufs := net.Buffers{w.k.hdr[:], b} // one writev: header and data in one segment
		_, err = bufs.WriteTo(w.p.conn)
	} else if len(b) > 0 {
		_, err = w.p.conn.Write(b)
	}
	if err != nil {
		return peerError(w.k, w.p, "send to", err)
	}
	return nil
}

func (c *Comm) recvFull(k *call, p *peer, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if _, err := io.ReadFull(p.conn, b); err != nil {
		return peerError(k, p, "receive from", err)
	}
	return nil
}

// recvHeader reads p's collective header and checks that p issued the same
// collective as this rank.
func (c *Comm) recvHeader(k *call, p *peer) error {
	if _, err := io.ReadFull(p.conn, p.hdr[:]); err != nil {
		return peerError(k, p, "receive from", err)
	}
	if p.hdr == k.hdr {
		return nil
	}
	got, ok := decodeHeader(p.hdr[:])
	if !ok {
		return fmt.Errorf("%w: rank %d is at %s but rank %d (%s) sent bytes that are not a collective header", ErrMismatch, c.rank, k, p.rank, p.addr)
	}
	return fmt.Errorf("%w: rank %d is at %s but rank %d (%s) is at %s; every rank must issue the same collectives, with the same dtypes, counts and roots, in the same order",
		ErrMismatch, c.rank, k, p.rank, p.addr, &got)
}
