// Package cpucomm is gotrain's pure-Go CPU backend: it implements comm.Comm
// with collectives over TCP between the ranks' processes, so that the whole
// system runs, and is tested, on machines without GPUs. It is also the
// baseline the NCCL backend is measured against.
//
// It is written by hand because no Go library does collectives over TCP:
// the Go MPI bindings need a C MPI installation, and gloo and NCCL are C++
// and CUDA. What is needed here is small: a full mesh of TCP connections, a
// ring, and reduction loops over typed slices.
//
// # Usage
//
//	c, err := cpucomm.New(ctx, cpucomm.Config{
//		Name: "default", Generation: gen, Rank: rank, Size: size,
//		Host: "10.0.0.7", Store: store, Logger: log,
//	})
//	if err != nil { ... }
//	defer c.Close()
//	grads := make([]float32, n)
//	err = c.AllReduce(ctx, comm.Host(grads), comm.Host(grads), comm.Avg)
//
// # Connecting
//
// New listens on an ephemeral port of Config.Host and Puts "host:port" under
// AddrKey(name, generation, rank) in the Store. Every rank dials the ranks
// below it (after Getting their addresses) and accepts the ranks above it, so
// each pair of ranks shares one TCP connection, with TCP_NODELAY.
//
// Every connection first proves, both ways, that its ends hold the job token
// (Config.Token, GOTRAIN_JOB_TOKEN in a worker), with HMAC-SHA256 keyed by the
// token; all integers little-endian:
//
//	acceptor: "GTCPUCM2" (8 bytes; the last is the protocol version), nonce A (32 bytes)
//	dialer:   hello, nonce D (32 bytes), HMAC("gotrain cpucomm dialer\x00" A D hello)
//	acceptor: reply, HMAC("gotrain cpucomm acceptor\x00" A D reply)
//
// where hello is
//
//	"GTCPUCM2"  8 bytes
//	rank        uint32
//	size        uint32
//	generation  int64
//	name        uint16 length, bytes
//	addr        uint16 length, bytes: the dialer's advertised address
//
// and reply is "GTCPUCM2", the acceptor's rank (uint32), a status byte (0
// accepted, 1 rejected) and a reason (uint16 length, bytes). The acceptor
// closes a connection whose HMAC is wrong without an answer; it rejects a
// hello whose name, generation or size differ from its own, or whose rank it
// does not expect, and keeps waiting: a stray from another job or generation
// does not break it. The dialer checks the acceptor's HMAC (a stranger
// listening at a published address does not get a rank's connection) and
// that the acceptor is the rank it meant to reach. Each accepted connection
// does its handshake in a goroutine of its own, within 5 s, and at most 64
// plus twice the ranks at once (internal/connguard): a silent connection
// delays no one and is closed at its deadline, and past the bound a new
// connection evicts the oldest of the address holding the most, so that
// strangers flooding a rank's port evict their own, not a rank's.
//
// # Collectives
//
// Every collective has a sequence number (Seq), counted from 1, that names it
// in errors ("allreduce #12"). On every connection it uses, a collective
// starts with a 32-byte header: magic "GTCC", kind, dtype, op, sequence
// number, count and root. The receiver compares it with its own; a
// difference means the ranks issued different collectives, and the error
// (wrapping ErrMismatch) names both. The data follows as raw elements in
// host byte order (all ranks run on one architecture), with no framing: both
// sides know the sizes.
//
// Small collectives, up to 16 KiB, use direct algorithms that cost one round
// of messages: in all-reduce every rank sends its buffer to every other rank
// and reduces the P buffers locally in rank order 0..P-1; all-gather and
// reduce-scatter send each block straight to the rank that needs it;
// broadcast's root sends to every rank. The sends run in a goroutine in the
// order r+1, r+2, … while the receives run in the order r-1, r-2, …, so each
// send meets its receive and no rank waits on a full socket buffer.
//
// Large collectives are pipelined around the ring 0 → 1 → … → P-1 → 0 in
// chunks of 512 KiB, sending to the next rank from a goroutine while
// receiving from the previous one: all-reduce is a reduce-scatter (P-1 steps
// in which every rank adds its part to a segment and passes it on) followed by
// an all-gather (P-1 steps that pass the finished segments around);
// all-gather and reduce-scatter are the respective halves; broadcast is a
// chain from the root. A rank forwards a chunk as soon as it has received and
// reduced it.
//
// # Determinism
//
// Every rank ends an all-reduce with bitwise identical results. In the ring,
// each segment is reduced once along one path and its bits are then copied to
// every rank; in the direct algorithm every rank reduces the same P buffers in
// the same order. Avg divides the sum once, at the end (integers truncate
// toward zero). Floating-point sums may still differ between the two
// algorithms, and so between buffer sizes, because they add in different
// orders.
//
// # Failures
//
// Any error breaks the communicator: its connections are closed, so that
// peers blocked on it fail too, and later collectives return an error
// wrapping the first one. If ctx is done during a collective, the
// connections are closed and the error wraps ctx.Err(). A peer that goes away
// is named: "cpucomm: rank 3 (10.0.0.9:4567) closed the connection during
// allreduce #12: EOF". A peer that fails closes its connections in turn, so
// the ranks around it may report that neighbour instead of the rank that
// failed first; the flight recorder sorts that out.
//
// # Performance
//
// Data moves between the user's memory and the socket without copies in Go
// (Buffer.HostBytes) and in large writes; incoming chunks to be reduced land
// in one reused buffer, and reductions are plain loops on typed slices. A
// collective allocates a few small objects (a goroutine, two channels); the
// chunk loop allocates nothing. Scratch memory grows to the largest need
// seen: P×16 KiB for the direct algorithms, (P-2)×recv bytes for a large
// reduce-scatter.
package cpucomm
