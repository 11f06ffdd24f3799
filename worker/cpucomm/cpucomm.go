package cpucomm

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gotrain/gotrain/internal/connguard"
	"github.com/gotrain/gotrain/worker/comm"
)

const (
	// directMaxBytes is the largest collective (in bytes of the biggest
	// buffer) that uses the direct algorithms. Small collectives cost round
	// trips, not bytes: the direct all-reduce does one round where the ring
	// does 2(P-1). But the direct all-reduce sends (P-1)×N bytes per rank
	// where the ring sends 2(P-1)/P×N, and it cannot pipeline. Measured with
	// BenchmarkAlgorithms over loopback (2 and 4 ranks, 2 cores), direct wins
	// below 16 KiB (13 µs against 21 µs at 4 KiB, 2 ranks), they tie at
	// 16 KiB, and the ring is 1.4 to 2.5 times faster at 64 KiB.
	directMaxBytes = 16 << 10

	// chunkBytes is the unit of pipelining in the ring and chain: a rank
	// forwards a chunk as soon as it has received (and reduced) it. Large
	// enough that a chunk is a few system calls, small enough to pipeline a
	// few MiB and to stay in cache between receive and reduce.
	chunkBytes = 512 << 10

	// acceptHandshakeTimeout bounds how long an accepted connection may take
	// to prove the token and introduce itself; handshakes run side by side,
	// so a silent stranger costs a descriptor for this long and delays no
	// one. dialHandshakeTimeout bounds the dialer's side.
	acceptHandshakeTimeout = 5 * time.Second
	dialHandshakeTimeout   = 10 * time.Second
	// maxPendingHandshakes, with twice the communicator's size, bounds the
	// accepted connections in their handshake at once (connguard: a new one
	// past it evicts the oldest of the source holding the most, so that
	// strangers flooding from other hosts evict their own connections, and
	// the ranks dialing at once all fit).
	maxPendingHandshakes = 64
)

// acceptLimits bound a rank's listener for a communicator of size ranks:
// at most size-1 ranks pass the handshake.
func acceptLimits(size int) connguard.Limits {
	return connguard.Limits{Unauthenticated: maxPendingHandshakes + 2*size, HandshakeTimeout: acceptHandshakeTimeout, Authenticated: size}
}

// Config configures a communicator.
type Config struct {
	Name       string     // communicator name; part of the rendezvous keys
	Generation int64      // job generation; part of the rendezvous keys
	Rank, Size int        // this rank and the number of ranks
	Host       string     // IP or host name to listen on and advertise, e.g. "127.0.0.1"
	Store      comm.Store // rendezvous: each rank Puts its address and Gets the others'
	// Token is the job token (GOTRAIN_JOB_TOKEN). Every connection between
	// two ranks proves that both ends hold it (doc.go, Connecting); a
	// connection that does not is closed at once. Empty: no secret, any
	// process that speaks the protocol can take a rank's place.
	Token  string
	Logger *slog.Logger // may be nil (then discard)
}

func (cfg *Config) validate() error {
	switch {
	case cfg.Size < 1:
		return fmt.Errorf("cpucomm: size is %d, want at least 1", cfg.Size)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return fmt.Errorf("cpucomm: rank %d is out of range for %d ranks (want 0..%d)", cfg.Rank, cfg.Size, cfg.Size-1)
	case cfg.Name == "":
		return errors.New("cpucomm: the communicator needs a Name (it scopes the rendezvous keys)")
	case len(cfg.Name) > maxNameLen:
		return fmt.Errorf("cpucomm: the communicator name is %d bytes, at most %d", len(cfg.Name), maxNameLen)
	case cfg.Generation < 0:
		return fmt.Errorf("cpucomm: generation is %d, want at least 0", cfg.Generation)
	case cfg.Size > 1 && cfg.Host == "":
		return errors.New("cpucomm: Host is empty; set the address this rank listens on and advertises, e.g. 127.0.0.1")
	case cfg.Size > 1 && cfg.Store == nil:
		return errors.New("cpucomm: Store is nil; the ranks need a rendezvous store to find each other")
	}
	return nil
}

// AddrKey returns the Store key under which rank publishes its address.
func AddrKey(name string, generation int64, rank int) string {
	return fmt.Sprintf("cpucomm/%s/%d/addr/%d", name, generation, rank)
}

// Comm is a communicator of the CPU backend. Like every comm.Comm it runs
// one collective at a time; Close may be called at any time from any
// goroutine and makes a collective in progress fail.
type Comm struct {
	name       string
	generation int64
	rank, size int
	token      []byte // the job token, the key of the handshake's HMACs
	log        *slog.Logger
	peers      []*peer // by rank; nil at this rank

	// Tunables, fixed by New; tests lower them to reach every code path with
	// small buffers.
	directMax int // bytes; see directMaxBytes
	chunk     int // bytes; see chunkBytes

	seq     uint64   // collectives issued
	in      []byte   // one incoming chunk, reduced from
	scratch []byte   // direct-algorithm slots and ring reduce-scatter partials
	steps   []step   // the current ring or chain plan
	barrier [2]int32 // barrier's send and recv element

	mu      sync.Mutex
	closed  bool  // Close was called
	failure error // what broke the communicator; the connections are closed
}

var _ comm.Comm = (*Comm)(nil)

// New validates cfg, listens on cfg.Host, publishes the address under
// AddrKey, and connects to every other rank: each rank dials the ranks below
// it and accepts the ranks above it. It returns when every connection is up
// and has passed the handshake, or with an error when ctx is done first. With
// Size 1 it uses no network.
func New(ctx context.Context, cfg Config) (*Comm, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Comm{
		name:       cfg.Name,
		generation: cfg.Generation,
		rank:       cfg.Rank,
		size:       cfg.Size,
		token:      []byte(cfg.Token),
		log:        log.With("comm", cfg.Name, "generation", cfg.Generation, "rank", cfg.Rank),
		directMax:  directMaxBytes,
		chunk:      chunkBytes,
	}
	if c.size == 1 {
		return c, nil
	}
	if err := c.connect(ctx, cfg.Host, cfg.Store); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Comm) Rank() int { return c.rank }
func (c *Comm) Size() int { return c.size }

// Seq returns the number of collectives this communicator has issued; the
// collective in progress, or the last one, has this number.
func (c *Comm) Seq() uint64 { return c.seq }

// Close closes the connections. A collective in progress fails; later ones
// return comm.ErrClosed. Close does not wait for peers.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.failure == nil {
		c.failure = comm.ErrClosed
		c.closeConnsLocked()
	}
	return nil
}

// fail records the first error that breaks the communicator and closes the
// connections, so that every blocked read and write returns.
func (c *Comm) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failure == nil {
		c.failure = err
		c.log.Debug("communicator failed", "err", err)
		c.closeConnsLocked()
	}
}

func (c *Comm) closeConnsLocked() {
	for _, p := range c.peers {
		if p != nil {
			p.conn.Close()
		}
	}
}

func (c *Comm) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failure
}

type dialResult struct {
	p   *peer
	err error
}

func (c *Comm) connect(ctx context.Context, host string, store comm.Store) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fmt.Errorf("cpucomm: rank %d: listen on %s: %w", c.rank, host, err)
	}
	defer ln.Close()
	gl := connguard.Listen(ln, fmt.Sprintf("rank %d's CPU backend port", c.rank), acceptLimits(c.size), c.log)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	port := ln.Addr().(*net.TCPAddr).Port
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	if err := store.Put(ctx, AddrKey(c.name, c.generation, c.rank), []byte(addr)); err != nil {
		return fmt.Errorf("cpucomm: rank %d: publish address %s: %w", c.rank, addr, err)
	}
	c.log.Debug("listening", "addr", addr)

	results := make(chan dialResult, c.size)
	for j := range c.rank {
		go func() {
			p, err := c.dial(ctx, store, addr, j)
			results <- dialResult{p, err}
		}()
	}
	go c.acceptAll(ctx, gl, results)

	peers := make([]*peer, c.size)
	var first error
	for range c.size - 1 {
		r := <-results
		switch {
		case r.err != nil && first == nil:
			first = r.err
			cancel()
		case r.p != nil:
			peers[r.p.rank] = r.p
		}
	}
	if first != nil {
		for _, p := range peers {
			if p != nil {
				p.conn.Close()
			}
		}
		return first
	}
	for _, p := range peers {
		if p != nil {
			p.conn.SetNoDelay(true)
		}
	}
	c.peers = peers
	c.log.Debug("connected", "peers", c.size-1)
	return nil
}

// dial connects to rank j (below this rank) and introduces itself.
func (c *Comm) dial(ctx context.Context, store comm.Store, self string, j int) (*peer, error) {
	v, err := store.Get(ctx, AddrKey(c.name, c.generation, j))
	if err != nil {
		return nil, fmt.Errorf("cpucomm: rank %d: get the address of rank %d: %w", c.rank, j, err)
	}
	addr := string(v)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cpucomm: rank %d: connect to rank %d at %s: %w", c.rank, j, addr, err)
	}
	tc := conn.(*net.TCPConn)
	stop := context.AfterFunc(ctx, func() { tc.Close() })
	tc.SetDeadline(time.Now().Add(dialHandshakeTimeout))
	err = c.clientHandshake(tc, self, j)
	tc.SetDeadline(time.Time{})
	if !stop() {
		tc.Close()
		return nil, fmt.Errorf("cpucomm: rank %d: handshake with rank %d at %s: %w", c.rank, j, addr, ctx.Err())
	}
	if err != nil {
		tc.Close()
		return nil, fmt.Errorf("cpucomm: rank %d: handshake with rank %d at %s: %w", c.rank, j, addr, err)
	}
	return &peer{rank: j, addr: addr, conn: tc}, nil
}

func (c *Comm) clientHandshake(conn net.Conn, self string, want int) error {
	nonceA, err := readChallenge(conn)
	if err != nil {
		return fmt.Errorf("read challenge: %w", err)
	}
	nonceD := make([]byte, nonceLen)
	_, _ = rand.Read(nonceD) // never fails (crypto/rand)
	h := encodeHello(hello{rank: c.rank, size: c.size, generation: c.generation, name: c.name, addr: self})
	msg := append(append(h, nonceD...), mac(c.token, "dialer", nonceA, nonceD, h)...)
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	rank, status, reason, raw, err := readReply(conn)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the listener closed the connection: it does not accept this rank's job token (check GOTRAIN_JOB_TOKEN), or it is not a rank of this job: %w", err)
	}
	if err != nil {
		return err
	}
	var got [macLen]byte
	if _, err := io.ReadFull(conn, got[:]); err != nil {
		return fmt.Errorf("read the listener's proof of the job token: %w", err)
	}
	if !hmac.Equal(got[:], mac(c.token, "acceptor", nonceA, nonceD, raw)) {
		return errors.New("the listener does not hold this job's token: a stranger, or a rank of another job, listens at the address the store gave")
	}
	if status != statusOK {
		return fmt.Errorf("rejected: %s", reason)
	}
	if rank != want {
		return fmt.Errorf("the listener there is rank %d, not %d; the store holds a stale or wrong address", rank, want)
	}
	return nil
}

// acceptAll accepts the ranks above this one and sends one result per rank.
// Each accepted connection does its handshake in a goroutine of its own, so a
// connection that stays silent delays no one; one that fails the handshake
// (no job token, another communicator or generation) is closed and does not
// count.
func (c *Comm) acceptAll(ctx context.Context, ln net.Listener, results chan<- dialResult) {
	a := &acceptor{waiting: map[int]bool{}}
	for j := c.rank + 1; j < c.size; j++ {
		a.waiting[j] = true
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for a.left() > 0 {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			missing := a.giveUp()
			err = fmt.Errorf("cpucomm: rank %d: wait for ranks %v to connect: %w", c.rank, missing, err)
			for range missing {
				results <- dialResult{err: err}
			}
			return
		}
		gc := conn.(*connguard.Conn) // within its bounds (connect)
		wg.Go(func() {
			rank, addr, err := c.serverHandshake(ctx, gc, a)
			if err == nil {
				err = gc.MarkAuthenticated()
			}
			if err != nil {
				c.log.Warn("rejected a connection", "remote", gc.RemoteAddr().String(), "err", err)
				gc.Close()
				return
			}
			// The peer's connection itself: collectives write it with
			// writev (net.Buffers); the listener and its bounds end with
			// connect.
			results <- dialResult{p: &peer{rank: rank, addr: addr, conn: gc.NetConn().(*net.TCPConn)}}
		})
	}
}

// acceptor is the ranks acceptAll still waits for, shared by its handshakes.
type acceptor struct {
	mu      sync.Mutex
	waiting map[int]bool
}

func (a *acceptor) left() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.waiting)
}

// claim takes rank off the waiting list; false if it was not on it.
func (a *acceptor) claim(rank int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ok := a.waiting[rank]
	delete(a.waiting, rank)
	return ok
}

// unclaim puts rank back (its handshake failed after the claim).
func (a *acceptor) unclaim(rank int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waiting[rank] = true
}

// giveUp empties the waiting list and returns the ranks that were on it.
func (a *acceptor) giveUp() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	missing := slices.Sorted(maps.Keys(a.waiting))
	clear(a.waiting)
	return missing
}

// serverHandshake challenges a dialer, checks its proof of the job token and
// its hello, claims its rank and returns the rank and advertised address. A
// dialer without the token is closed without an answer.
func (c *Comm) serverHandshake(ctx context.Context, conn net.Conn, a *acceptor) (int, string, error) {
	deadline := time.Now().Add(acceptHandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	nonceA, err := writeChallenge(conn)
	if err != nil {
		return 0, "", fmt.Errorf("send challenge: %w", err)
	}
	h, raw, err := readHello(conn)
	if err != nil {
		return 0, "", fmt.Errorf("read hello: %w", err)
	}
	var proof [nonceLen + macLen]byte
	if _, err := io.ReadFull(conn, proof[:]); err != nil {
		return 0, "", fmt.Errorf("read the dialer's proof of the job token: %w", err)
	}
	nonceD := proof[:nonceLen]
	if !hmac.Equal(proof[nonceLen:], mac(c.token, "dialer", nonceA, nonceD, raw)) {
		return 0, "", fmt.Errorf("the dialer (claiming rank %d) does not hold this job's token", h.rank)
	}
	reply := func(status byte, reason string) error {
		r := encodeReply(c.rank, status, reason)
		_, err := conn.Write(append(r, mac(c.token, "acceptor", nonceA, nonceD, r)...))
		return err
	}
	var reason string
	switch {
	case h.name != c.name:
		reason = fmt.Sprintf("communicator name %q, but this is %q", h.name, c.name)
	case h.generation != c.generation:
		reason = fmt.Sprintf("generation %d, but this is generation %d", h.generation, c.generation)
	case h.size != c.size:
		reason = fmt.Sprintf("size %d, but this communicator has %d ranks", h.size, c.size)
	case h.rank <= c.rank || h.rank >= c.size:
		reason = fmt.Sprintf("rank %d, but rank %d accepts only ranks %d..%d", h.rank, c.rank, c.rank+1, c.size-1)
	case !a.claim(h.rank):
		reason = fmt.Sprintf("rank %d, which is already connected", h.rank)
	}
	if reason != "" {
		reason = fmt.Sprintf("rank %d of %q generation %d: the dialer says %s", c.rank, c.name, c.generation, reason)
		reply(statusReject, reason)
		return 0, "", errors.New(reason)
	}
	if err := reply(statusOK, ""); err != nil {
		a.unclaim(h.rank)
		return 0, "", fmt.Errorf("reply to rank %d: %w", h.rank, err)
	}
	addr := h.addr
	if addr == "" {
		addr = conn.RemoteAddr().String()
	}
	return h.rank, addr, nil
}
