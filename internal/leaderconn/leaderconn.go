// Package leaderconn is a gRPC client connection to a replicated
// coordinator: it holds the addresses of the replicas and sends every call
// to the current leader, so that a leader change is invisible to callers.
//
// A replica that is not the leader fails each call with codes.Unavailable
// and names the leader in the trailer LeaderKey (NotLeader builds that
// answer on the server side). The Conn follows the hint at once; without
// one (an election, or a replica that is down) it tries the replicas in
// turn, backing off from 25 ms to 500 ms, for at most the failover window
// (15 s by default) of each call. It then returns the last error
// unchanged, so a caller's handling of Unavailable keeps working.
//
// A server-streaming call (WatchGenerations) whose first receive fails with
// Unavailable is opened again on the leader with the request replayed;
// once a message has arrived, errors go to the caller, and the Conn only
// points the caller's next attempt at the hinted leader.
//
// # Usage
//
//	lc, err := leaderconn.New(addrs, func(addr string) (*grpc.ClientConn, error) {
//		return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
//	}, leaderconn.WithOnSwitch(func(from, to, why string) {
//		fmt.Fprintf(os.Stderr, "gotrain: the coordinator's leader is now at %s (%s)\n", to, why)
//	}))
//	if err != nil { ... }
//	defer lc.Close()
//	client := gotrainv1.NewCoordinatorClient(lc)
//
// And on a replica that is not the leader, in every handler:
//
//	return nil, leaderconn.NotLeader(ctx, self, leaderAddr)
package leaderconn

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// LeaderKey is the trailer metadata key in which a replica that is not the
// leader names the leader's gRPC address (HOST:PORT); absent or empty when
// it knows no leader (an election is in progress).
const LeaderKey = "gotrain-leader"

// ErrClosed is returned by calls on a closed Conn.
var ErrClosed = errors.New("leaderconn: the connection is closed")

// NotLeader is a non-leader replica's answer to any call: Unavailable,
// with the leader's address (leader, "" when unknown) in the trailer
// LeaderKey. ctx is the handler's context (a stream's Context() for
// streaming calls); self names this replica in the message.
func NotLeader(ctx context.Context, self, leader string) error {
	if leader == "" {
		return status.Errorf(codes.Unavailable, "coordinator replica %s is not the leader; no leader is known yet (an election is in progress)", self)
	}
	// SetTrailer fails only outside a gRPC handler; the status then still
	// says where the leader is, for a person to read.
	_ = grpc.SetTrailer(ctx, metadata.Pairs(LeaderKey, leader))
	return status.Errorf(codes.Unavailable, "coordinator replica %s is not the leader; the leader is at %s", self, leader)
}

// leaderHint is the leader a trailer names, "" for none.
func leaderHint(md metadata.MD) string {
	if v := md.Get(LeaderKey); len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// Option configures a Conn.
type Option func(*config)

type config struct {
	window     time.Duration
	minBackoff time.Duration
	maxBackoff time.Duration
	onSwitch   func(from, to, why string)
}

// WithFailoverWindow bounds how long one call keeps looking for a leader
// after its first Unavailable (default 15 s); the caller's context bounds
// it too.
func WithFailoverWindow(d time.Duration) Option { return func(c *config) { c.window = d } }

// WithOnSwitch has f called (outside any lock, possibly concurrently) each
// time the Conn's target changes: from the old target to the new one, why
// in words. The Conn logs nothing itself.
func WithOnSwitch(f func(from, to, why string)) Option {
	return func(c *config) { c.onSwitch = f }
}

// Conn is a grpc.ClientConnInterface that sends every call to the
// coordinator's current leader. It is safe for concurrent use.
type Conn struct {
	cfg  config
	dial func(addr string) (*grpc.ClientConn, error)

	mu     sync.Mutex
	addrs  []string
	target string
	conns  map[string]*grpc.ClientConn
	closed bool
}

var _ grpc.ClientConnInterface = (*Conn)(nil)

// New is a Conn over the replicas at addrs (HOST:PORT, the first is the
// first target). dial makes the connection to one address, the first time
// a call goes there; the Conn keeps it until Close.
func New(addrs []string, dial func(addr string) (*grpc.ClientConn, error), opts ...Option) (*Conn, error) {
	cfg := config{window: 15 * time.Second, minBackoff: 25 * time.Millisecond, maxBackoff: 500 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Conn{cfg: cfg, dial: dial, conns: map[string]*grpc.ClientConn{}}
	c.addrs = merge(nil, addrs)
	if len(c.addrs) == 0 {
		return nil, errors.New("leaderconn: no coordinator address")
	}
	c.target = c.addrs[0]
	return c, nil
}

func merge(known, more []string) []string {
	for _, a := range more {
		if a != "" && !slices.Contains(known, a) {
			known = append(known, a)
		}
	}
	return known
}

// SetAddrs adds the replicas at addrs that the Conn does not know yet (as
// learned from a replica); known ones stay, in their order, and so does
// the current target.
func (c *Conn) SetAddrs(addrs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addrs = merge(c.addrs, addrs)
}

// Addrs are the replicas' addresses the Conn knows.
func (c *Conn) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.addrs)
}

// Leader is the address calls go to now: the last known leader.
func (c *Conn) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.target
}

// Close closes the connections to every replica. Calls in flight fail.
func (c *Conn) Close() error {
	c.mu.Lock()
	conns := c.conns
	c.conns, c.closed = nil, true
	c.mu.Unlock()
	var errs []error
	for _, a := range slices.Sorted(maps.Keys(conns)) {
		if err := conns[a].Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the connection to %s: %w", a, err))
		}
	}
	return errors.Join(errs...)
}

// current is the target and its connection, dialled on first use.
func (c *Conn) current() (string, *grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", nil, ErrClosed
	}
	t := c.target
	if cc := c.conns[t]; cc != nil {
		return t, cc, nil
	}
	cc, err := c.dial(t)
	if err != nil {
		return t, nil, fmt.Errorf("leaderconn: dial coordinator replica %s: %w", t, err)
	}
	c.conns[t] = cc
	return t, cc, nil
}

// failed moves the target on after a call to from failed with Unavailable:
// to the hinted leader, else to the replica after from. It does nothing
// when another call has moved the target off from already, so that
// concurrent failures move it once.
func (c *Conn) failed(from, hint string) {
	c.mu.Lock()
	if c.target != from {
		c.mu.Unlock()
		return
	}
	to, why := hint, "named by replica "+from
	if hint == "" || hint == from {
		i := slices.Index(c.addrs, from)
		to = c.addrs[(i+1)%len(c.addrs)]
		why = "replica " + from + " is unavailable and named no leader"
	} else {
		c.addrs = merge(c.addrs, []string{hint})
	}
	c.target = to
	f := c.cfg.onSwitch
	c.mu.Unlock()
	if f != nil && to != from {
		f(from, to, why)
	}
}

// retry is one call's search for the leader: the failover window since
// its first Unavailable and its backoff.
type retry struct {
	c       *Conn
	start   time.Time
	backoff time.Duration
	hops    int // redirects followed without a pause
}

// next moves the target on after target failed with err and trailer hint
// and waits as needed; false when the call must return err: not
// Unavailable, ctx done or the window over.
func (r *retry) next(ctx context.Context, target, hint string, err error) bool {
	if status.Code(err) != codes.Unavailable {
		return false
	}
	r.c.failed(target, hint)
	if ctx.Err() != nil {
		return false
	}
	if r.start.IsZero() {
		r.start = time.Now()
		r.backoff = r.c.cfg.minBackoff
	}
	if time.Since(r.start) >= r.c.cfg.window {
		return false
	}
	// A hint is followed at once; but two replicas with stale views could
	// send a call back and forth, so after a few hops it pauses too.
	if hint != "" && hint != target && r.hops < 3 {
		r.hops++
		return true
	}
	r.hops = 0
	d := min(r.backoff, r.c.cfg.window-time.Since(r.start))
	r.backoff = min(2*r.backoff, r.c.cfg.maxBackoff)
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Invoke sends a unary call to the leader (grpc.ClientConnInterface).
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	r := retry{c: c}
	for {
		target, cc, err := c.current()
		if errors.Is(err, ErrClosed) {
			return err
		}
		var trailer metadata.MD
		if err == nil {
			err = cc.Invoke(ctx, method, args, reply, append(opts[:len(opts):len(opts)], grpc.Trailer(&trailer))...)
		} else {
			// A replica that cannot be dialled is as good as down.
			err = status.Error(codes.Unavailable, err.Error())
		}
		if err == nil || !r.next(ctx, target, leaderHint(trailer), err) {
			return err
		}
	}
}

// NewStream opens a stream on the leader (grpc.ClientConnInterface). See
// the package doc for what it does when the leader changes.
func (c *Conn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s := &stream{c: c, ctx: ctx, desc: desc, method: method, opts: opts,
		replay: desc.ServerStreams && !desc.ClientStreams}
	r := retry{c: c}
	for {
		target, cs, err := s.open()
		if err == nil {
			s.cs, s.target = cs, target
			return s, nil
		}
		if errors.Is(err, ErrClosed) || !r.next(ctx, target, "", err) {
			return nil, err
		}
	}
}

func (s *stream) open() (string, grpc.ClientStream, error) {
	target, cc, err := s.c.current()
	if errors.Is(err, ErrClosed) {
		return target, nil, err
	}
	if err != nil {
		return target, nil, status.Error(codes.Unavailable, err.Error())
	}
	cs, err := cc.NewStream(s.ctx, s.desc, s.method, s.opts...)
	return target, cs, err
}

// stream is a grpc.ClientStream on the leader. For a server-streaming call
// it keeps what the caller sent, to replay it on another replica until the
// first message arrives.
type stream struct {
	c      *Conn
	ctx    context.Context
	desc   *grpc.StreamDesc
	method string
	opts   []grpc.CallOption
	replay bool

	mu        sync.Mutex // guards the fields below
	cs        grpc.ClientStream
	target    string
	sent      []any
	closeSent bool
	received  bool
}

func (s *stream) cur() (grpc.ClientStream, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cs, s.target
}

func (s *stream) Context() context.Context { cs, _ := s.cur(); return cs.Context() }
func (s *stream) Trailer() metadata.MD     { cs, _ := s.cur(); return cs.Trailer() }

func (s *stream) Header() (metadata.MD, error) {
	cs, target := s.cur()
	md, err := cs.Header()
	if status.Code(err) == codes.Unavailable {
		s.c.failed(target, leaderHint(cs.Trailer()))
	}
	return md, err
}

func (s *stream) SendMsg(m any) error {
	cs, _ := s.cur()
	if s.replay {
		s.mu.Lock()
		s.sent = append(s.sent, m)
		s.mu.Unlock()
	}
	return cs.SendMsg(m)
}

func (s *stream) CloseSend() error {
	cs, _ := s.cur()
	s.mu.Lock()
	s.closeSent = true
	s.mu.Unlock()
	return cs.CloseSend()
}

func (s *stream) RecvMsg(m any) error {
	cs, target := s.cur()
	err := cs.RecvMsg(m)
	s.mu.Lock()
	reopen := s.replay && !s.received
	if err == nil {
		s.received = true
	}
	s.mu.Unlock()
	if status.Code(err) != codes.Unavailable {
		return err
	}
	if !reopen {
		s.c.failed(target, leaderHint(cs.Trailer()))
		return err
	}
	// Nothing has arrived: open the call again where the leader is now.
	r := retry{c: s.c}
	hint := leaderHint(cs.Trailer())
	for r.next(s.ctx, target, hint, err) {
		target, cs, err = s.open()
		if errors.Is(err, ErrClosed) {
			return err
		}
		hint = ""
		if err == nil {
			s.resend(cs)
			err = cs.RecvMsg(m)
			hint = leaderHint(cs.Trailer())
			s.mu.Lock()
			s.cs, s.target = cs, target
			s.received = err == nil
			s.mu.Unlock()
		}
		if status.Code(err) != codes.Unavailable {
			return err
		}
	}
	return err
}

// resend replays on cs what the caller sent on the stream so far. An
// error ends cs; its RecvMsg then returns the status.
func (s *stream) resend(cs grpc.ClientStream) {
	s.mu.Lock()
	sent, closeSent := slices.Clone(s.sent), s.closeSent
	s.mu.Unlock()
	for _, m := range sent {
		if cs.SendMsg(m) != nil {
			return
		}
	}
	if closeSent {
		_ = cs.CloseSend()
	}
}
