// Package memsnap is the in-memory snapshot tier of a job: each rank's newest
// complete training state, kept by its node's agent in memory that outlives
// the worker process, so that a restarted rank resumes from its last step
// instead of its last disk checkpoint.
//
// The state never travels through gRPC or through the agent's heap: the
// worker writes it into a memfd it created (an anonymous shared-memory file),
// and hands the file descriptor to its agent over the agent's snapshot socket
// (a unix SOCK_SEQPACKET socket beside the agent's gRPC socket, with
// SCM_RIGHTS). The agent seals the memfd (no more writes, no resizing),
// checks its length and CRC-32C against what the worker said, and only then
// makes it the rank's newest snapshot. A restarted worker asks for it and gets
// a duplicate of the same descriptor: it maps the pages the dead process
// wrote, read-only, and checks length and checksum again before using them.
//
// Double buffering: a snapshot being written is a memfd the agent has not
// seen; the one it serves is sealed and complete. A worker that dies while
// writing, or hands over a file that is shorter than it claims or does not
// match its checksum, leaves the previous snapshot in place: a torn or
// partial snapshot is never served. Package worker goes one step further
// for speed: it keeps two memfds and writes them in turn (CommitReused), only
// ever into the one the agent does not serve, so that a snapshot's copy runs
// at memory speed instead of faulting in fresh pages. Those are not sealed;
// the agent checks their checksum when it takes one and every reader checks
// it again, so one changed while served is refused, never handed out.
//
// Peer replicas (peer.go): the agent sends each snapshot on to its ring
// neighbour's agent over the SnapshotPeer gRPC service, in chunks; the
// receiver keeps a replica only once all of it came and matches its length
// and checksum, beside (never in place of) its own snapshots, within the
// same --snapshot-memory, counted as its bytes arrive (Receipt). A rank with
// no own snapshot here is served the replica this agent holds, else the
// newest one a peer holds (Server.Fetch); a replica never outranks an own
// snapshot. Every snapshot that crosses nodes carries a MAC of its facts by
// the job's snapshot key (mac.go), checked on receipt and after a fetch,
// and PeerServer asks PeerAccess which node may send or read which rank
// (internal/launcher/snaptier: the nodes of the current generation, each for its
// own ranks).
//
// Usage (agent side):
//
//	st := memsnap.NewStore(limitBytes)
//	srv := &memsnap.Server{Store: st, Token: token, Authorize: checkPidIsRank}
//	go srv.Serve(ctx, lis) // lis: memsnap.Listen(filepath.Join(dir, memsnap.SocketName))
//
// Worker side:
//
//	c, _ := memsnap.Dial(ctx, memsnap.SocketFor(agentSocket), token, rank)
//	b, _ := c.NewBuffer(n)   // pre-faulted shared memory
//	copy(b.Bytes(), state)   // the only copy on the training step's path
//	_ = c.Commit(b, step)    // checksum, hand-over, the agent's verdict
//	s, _ := c.Latest()       // after a restart: the newest complete snapshot
//
// Package worker wraps the client so that the hand-over overlaps the next
// step (worker.Snapshots).
package memsnap
