// Package leaderconn is a gRPC client connection to a replicated
// coordinator: it holds the addresses of the replicas and sends every call
// to the current leader, so that a leader change is invisible to callers.
//
// A replica that is not the leader fails each call with codes.Unavailable
// and names the leader in the trailer LeaderKey (NotLeader builds that
// answer on the server side), with proof beside it (TermKey, SigKey: the
// replica set's signature of HintMessage). The Conn follows the hint at
// once — WithHintCheck, only a hint whose proof passes; without
// one (an election, or a replica that is down) it tries the replicas in
// turn, backing off from 25 ms to 500 ms, for at most the failover window
// (15 s by default) of each call. It then returns the last error
// unchanged, so a caller's handling of Unavailable keeps working.
//
// A leader that is partitioned away refuses nothing: its calls just hang.
// WithProbe names a short unary call that is sent often (the agent's
// heartbeat, ReportProgress) and gives each of its attempts a timeout of
// its own; an attempt that times out while the caller's context is alive
// counts as Unavailable without a hint, so the Conn moves on to the next
// replica, which names the new leader; and the connection to the replica
// that did not answer is dropped, so that the next call there connects
// afresh (the old one may stay silent for seconds after a partition
// heals). Other calls (long polls such as
// KVGet with a wait, Barrier, WatchGenerations) get no such timeout.
//
// Whenever the Conn's target changes, by a hint or by moving on, every
// call still in flight on the old target moves with it: a unary attempt
// there is canceled and retried at the new target as if it had failed
// with Unavailable (the caller's context and the failover window still
// bound it), and a stream there is canceled. A call that completes is
// not affected.
//
// A server-streaming call (WatchGenerations) that has received nothing
// yet, and whose stream fails with Unavailable or is canceled so, is
// opened again where the leader is, with the request replayed. Once a
// message has arrived, errors go to the caller: after a move its next
// receive returns codes.Unavailable saying that the leader moved, and
// the caller opens the watch again; the Conn only points that next
// attempt at the leader.
//
// The Conn keeps what each replica last said (Replicas): that it served
// the call, named a leader, knows none, or could not be reached. A caller
// that gives up asks NoMajority for the verdict: it depends only on those
// states, not on which replica happened to be tried last.
//
// # Usage
//
//	lc, err := leaderconn.New(addrs, func(addr string) (*grpc.ClientConn, error) {
//		return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
//	},
//		leaderconn.WithProbe(gotrainv1.Coordinator_ReportProgress_FullMethodName, 3*time.Second),
//		leaderconn.WithOnSwitch(func(from, to, why string) {
//			fmt.Fprintf(os.Stderr, "gotrain: the coordinator's leader is now at %s (%s)\n", to, why)
//		}))
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
	"strconv"
	"strings"
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

// TermKey and SigKey are the trailer keys in which a replica vouches for
// its hint: the Raft term, and the replica set's signature (base64) of
// HintMessage. A Conn WithHintCheck follows only hints that pass its
// check.
const (
	TermKey = "gotrain-leader-term"
	SigKey  = "gotrain-leader-sig"
)

// HintMessage is what the signature of a hint naming leader in term
// covers.
func HintMessage(leader string, term uint64) []byte {
	return fmt.Appendf(nil, "gotrain leader hint v1\n%s\n%d", leader, term)
}

// NotLeader is a non-leader replica's answer to any call: Unavailable,
// with the leader's address (leader, "" when unknown) in the trailer
// LeaderKey, and the pairs of proof (TermKey, SigKey and their values)
// beside it. ctx is the handler's context (a stream's Context() for
// streaming calls); self names this replica in the message.
func NotLeader(ctx context.Context, self, leader string, proof ...string) error {
	if leader == "" {
		return status.Errorf(codes.Unavailable, "coordinator replica %s is not the leader; no leader is known yet (an election is in progress)", self)
	}
	// SetTrailer fails only outside a gRPC handler; the status then still
	// says where the leader is, for a person to read.
	_ = grpc.SetTrailer(ctx, metadata.Pairs(append([]string{LeaderKey, leader}, proof...)...))
	return status.Errorf(codes.Unavailable, "coordinator replica %s is not the leader; the leader is at %s", self, leader)
}

// leaderHint is the leader a trailer names, "" for none, or for one that
// fails the Conn's check (WithHintCheck).
func (c *Conn) leaderHint(md metadata.MD) string {
	v := md.Get(LeaderKey)
	if len(v) == 0 || v[len(v)-1] == "" {
		return ""
	}
	leader := v[len(v)-1]
	if c.cfg.checkHint != nil {
		if err := c.cfg.checkHint(leader, md); err != nil {
			return ""
		}
	}
	return leader
}

// Hint is a hint's term and signature as a trailer carries them (zero
// values when absent).
func Hint(md metadata.MD) (term uint64, sig string) {
	if v := md.Get(TermKey); len(v) > 0 {
		term, _ = strconv.ParseUint(v[len(v)-1], 10, 64)
	}
	if v := md.Get(SigKey); len(v) > 0 {
		sig = v[len(v)-1]
	}
	return term, sig
}

// Option configures a Conn.
type Option func(*config)

type config struct {
	window     time.Duration
	minBackoff time.Duration
	maxBackoff time.Duration
	probes     map[string]time.Duration
	onSwitch   func(from, to, why string)
	checkHint  func(leader string, md metadata.MD) error
}

// WithHintCheck has the Conn follow a replica's leader hint only when
// check(leader, trailer) returns nil (the agent's: the replica set's
// signature, SigKey, under the CA it pinned); a hint it refuses is
// ignored, as if the replica knew no leader. check logs why.
func WithHintCheck(check func(leader string, md metadata.MD) error) Option {
	return func(c *config) { c.checkHint = check }
}

// WithFailoverWindow bounds how long one call keeps looking for a leader
// after its first Unavailable (default 15 s); the caller's context bounds
// it too.
func WithFailoverWindow(d time.Duration) Option { return func(c *config) { c.window = d } }

// WithProbe gives each attempt of the unary method (its full name, as
// "/gotrain.v1.Coordinator/ReportProgress") a timeout of its own. An
// attempt that times out while the caller's context is alive means the
// replica is unreachable (a partitioned leader): the Conn moves on to the
// next replica as after an Unavailable without a hint, moves the calls in
// flight there with it, and retries. The method should be a quick one
// that is sent often, and timeout well above its normal latency: a
// leader too slow to answer it in time is left as if it were away. It
// applies only while the Conn knows more than one replica.
func WithProbe(method string, timeout time.Duration) Option {
	return func(c *config) {
		if c.probes == nil {
			c.probes = map[string]time.Duration{}
		}
		c.probes[method] = timeout
	}
}

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
	target *epoch
	conns  map[string]*grpc.ClientConn
	// retired are connections dropped after a probe got no answer, each
	// with the timer that closes it (redial).
	retired map[*grpc.ClientConn]*time.Timer
	heard   map[string]ReplicaState // the last outcome of a call at each address
	closed  bool
}

var _ grpc.ClientConnInterface = (*Conn)(nil)

// epoch is one stay of the Conn's target at an address: from the time
// calls start going there until they go elsewhere. Its ctx is canceled,
// with a *movedError, when it ends; the attempts made in it watch ctx.
type epoch struct {
	addr string
	ctx  context.Context
	end  context.CancelCauseFunc
}

func newEpoch(addr string) *epoch {
	ctx, end := context.WithCancelCause(context.Background())
	return &epoch{addr: addr, ctx: ctx, end: end}
}

// movedError is why an attempt on a replica was canceled: the Conn's
// target moved off it.
type movedError struct{ from, to string }

func (e *movedError) Error() string { return "the coordinator's leader moved to " + e.to }

// probeTimeoutError is why a probe's attempt was canceled.
type probeTimeoutError struct {
	addr, method string
	timeout      time.Duration
}

func (e *probeTimeoutError) Error() string {
	return fmt.Sprintf("coordinator replica %s did not answer %s within %v", e.addr, e.method, e.timeout)
}

// New is a Conn over the replicas at addrs (HOST:PORT, the first is the
// first target). dial makes the connection to one address, the first time
// a call goes there; the Conn keeps it until Close.
func New(addrs []string, dial func(addr string) (*grpc.ClientConn, error), opts ...Option) (*Conn, error) {
	cfg := config{window: 15 * time.Second, minBackoff: 25 * time.Millisecond, maxBackoff: 500 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Conn{cfg: cfg, dial: dial, conns: map[string]*grpc.ClientConn{}, retired: map[*grpc.ClientConn]*time.Timer{}, heard: map[string]ReplicaState{}}
	c.addrs = merge(nil, addrs)
	if len(c.addrs) == 0 {
		return nil, errors.New("leaderconn: no coordinator address")
	}
	c.target = newEpoch(c.addrs[0])
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
	return c.target.addr
}

// Close closes the connections to every replica. Calls in flight fail.
func (c *Conn) Close() error {
	c.mu.Lock()
	conns, retired := c.conns, c.retired
	c.conns, c.retired, c.closed = nil, nil, true
	c.mu.Unlock()
	for cc, t := range retired {
		t.Stop()
		_ = cc.Close()
	}
	var errs []error
	for _, a := range slices.Sorted(maps.Keys(conns)) {
		if err := conns[a].Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the connection to %s: %w", a, err))
		}
	}
	return errors.Join(errs...)
}

// Closed says whether Close was called.
func (c *Conn) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Heard is what a replica's last answer (or silence) says about it.
type Heard int

const (
	// NotTried: no call has gone there yet.
	NotTried Heard = iota
	// Answers: it served a call, or answered as the leader does (an error
	// other than Unavailable: the job's own answer).
	Answers
	// NamesLeader: it does not lead and named the replica that does.
	NamesLeader
	// NoLeader: it does not lead and knows no leader (an election, or no
	// majority left).
	NoLeader
	// Unreachable: the network's answer, not the replica's: the
	// connection was refused, broke or could not be made, or a probe got
	// no answer in time.
	Unreachable
)

func (h Heard) String() string {
	switch h {
	case NotTried:
		return "not tried"
	case Answers:
		return "answers"
	case NamesLeader:
		return "names a leader"
	case NoLeader:
		return "has no leader"
	case Unreachable:
		return "unreachable"
	}
	return fmt.Sprintf("Heard(%d)", int(h))
}

// ReplicaState is the outcome of the last call the Conn made at one
// replica.
type ReplicaState struct {
	Addr   string
	Heard  Heard
	At     time.Time // when; zero for NotTried
	Leader string    // the leader it named (NamesLeader)
	Err    error     // what the call returned; nil for Answers and NotTried
	// OK is when a call there last succeeded (zero: never): proof that it
	// leads, which an answer with another error (a deadline) is not.
	OK time.Time
}

// record notes the outcome of a call at addr: err what the replica (or the
// network) returned, trailer the leader it named.
func (c *Conn) record(addr string, err error, trailer string) {
	st := ReplicaState{Addr: addr, At: time.Now(), Err: err}
	switch {
	case err == nil || status.Code(err) != codes.Unavailable:
		st.Heard, st.Err = Answers, nil
	case !answered(err):
		st.Heard = Unreachable
	case trailer != "" && trailer != addr:
		st.Heard, st.Leader = NamesLeader, trailer
	default:
		st.Heard = NoLeader
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st.OK = c.heard[addr].OK
	if err == nil {
		st.OK = st.At
	}
	c.heard[addr] = st
}

// Replicas is what the Conn last heard from each replica it knows, in the
// order of Addrs.
func (c *Conn) Replicas() []ReplicaState {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ReplicaState, 0, len(c.addrs))
	for _, a := range c.addrs {
		st, ok := c.heard[a]
		if !ok {
			st = ReplicaState{Addr: a}
		}
		out = append(out, st)
	}
	return out
}

// NoMajority is the verdict on a replicated coordinator from what its
// replicas said since since (a client that lost contact then): when none
// answered as the leader, and a majority of them either could not be
// reached or answered that they know no leader, the job cannot be served
// from here, and the error says what each replica said; otherwise nil
// (one answers, or too few were heard from to tell). It depends only on
// the replicas' states, not on the order in which they were heard. A
// single coordinator gets no verdict.
func NoMajority(replicas []ReplicaState, since time.Time) error {
	if len(replicas) < 2 {
		return nil
	}
	var said []string
	down := 0
	for _, r := range replicas {
		if r.Heard == NotTried || r.At.Before(since) {
			said = append(said, r.Addr+" was not tried since contact was lost")
			continue
		}
		switch r.Heard {
		case Answers:
			return nil
		case NamesLeader:
			said = append(said, r.Addr+" names "+r.Leader+" as the leader")
		case NoLeader:
			down++
			said = append(said, r.Addr+" has no leader")
		case Unreachable:
			down++
			said = append(said, r.Addr+" "+unreachable(r.Err))
		}
	}
	if down <= len(replicas)/2 {
		return nil
	}
	return fmt.Errorf("no majority of the coordinator's %d replicas answers with a leader: %s", len(replicas), strings.Join(said, ", "))
}

// AllRefused says whether every replica refused the connection when last
// tried, since since: their hosts answer and nothing listens there (the
// coordinator's processes are gone), which no blip explains.
func AllRefused(replicas []ReplicaState, since time.Time) bool {
	for _, r := range replicas {
		if r.Heard != Unreachable || r.At.Before(since) || !strings.Contains(status.Convert(r.Err).Message(), "connection refused") {
			return false
		}
	}
	return len(replicas) > 0
}

// unreachable says in a few words why a replica could not be reached.
func unreachable(err error) string {
	m := status.Convert(err).Message()
	switch {
	case strings.Contains(m, "connection refused"):
		return "refused the connection"
	case strings.Contains(m, " did not answer "): // a probe's timeout
		return "did not answer in time"
	case strings.Contains(m, "i/o timeout"), strings.Contains(m, "context deadline exceeded"):
		return "could not be reached in time"
	}
	return "is unreachable (" + m + ")"
}

// current is the target's epoch and connection, dialled on first use, and
// the per-attempt timeout of method there (0 for none).
func (c *Conn) current(method string) (*epoch, *grpc.ClientConn, time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, 0, ErrClosed
	}
	e := c.target
	var probe time.Duration
	if len(c.addrs) > 1 {
		probe = c.cfg.probes[method]
	}
	if cc := c.conns[e.addr]; cc != nil {
		return e, cc, probe, nil
	}
	cc, err := c.dial(e.addr)
	if err != nil {
		return e, nil, 0, fmt.Errorf("leaderconn: dial coordinator replica %s: %w", e.addr, err)
	}
	c.conns[e.addr] = cc
	return e, cc, probe, nil
}

// failed moves the target on after a call in epoch e failed with
// Unavailable: to the hinted leader, else to the replica after e's. It
// does nothing when e has ended already (another call moved the target),
// so that concurrent failures move it once. Moving ends e, which cancels
// the attempts still in flight there.
func (c *Conn) failed(e *epoch, hint string) {
	c.mu.Lock()
	if c.target != e {
		c.mu.Unlock()
		return
	}
	from := e.addr
	to, why := hint, "named by replica "+from
	if hint == "" || hint == from {
		i := slices.Index(c.addrs, from)
		to = c.addrs[(i+1)%len(c.addrs)]
		why = "replica " + from + " is unavailable and named no leader"
	} else {
		c.addrs = merge(c.addrs, []string{hint})
	}
	if to == from {
		c.mu.Unlock()
		return
	}
	c.target = newEpoch(to)
	f := c.cfg.onSwitch
	c.mu.Unlock()
	e.end(&movedError{from: from, to: to})
	if f != nil {
		f(from, to, why)
	}
}

// attempt is one try of a call in an epoch. Its ctx, under the caller's,
// is canceled when the epoch ends or a probe's timeout passes.
type attempt struct {
	e       *epoch
	ctx     context.Context
	cancel  context.CancelCauseFunc
	stop    func() bool        // stops watching e
	timeout *probeTimeoutError // a probe's, else nil
}

// begin starts an attempt in e under ctx, with the per-attempt timeout
// probe unless it is 0. The attempt's end must be called.
func (e *epoch) begin(ctx context.Context, method string, probe time.Duration) *attempt {
	actx, cancel := context.WithCancelCause(ctx)
	a := &attempt{e: e, ctx: actx, cancel: cancel}
	a.stop = context.AfterFunc(e.ctx, func() { cancel(context.Cause(e.ctx)) })
	if probe > 0 {
		a.timeout = &probeTimeoutError{addr: e.addr, method: method, timeout: probe}
		tctx, tcancel := context.WithTimeoutCause(actx, probe, a.timeout)
		a.ctx = tctx
		a.cancel = func(cause error) { tcancel(); cancel(cause) }
	}
	return a
}

// end releases the attempt and says how err, what the call returned in
// it, is to be taken: an attempt canceled because the target moved, or a
// probe that timed out, is Unavailable (with the new target as the hint
// for the former), unless the caller's ctx is done; other errors are
// unchanged. trailer is the leader the replica named, "" for none; the
// hint returned is where to go next. The outcome is recorded as what the
// replica said (Conn.Replicas).
func (a *attempt) end(c *Conn, ctx context.Context, err error, trailer string) (string, error) {
	cause := context.Cause(a.ctx)
	a.stop()
	a.cancel(nil)
	if ctx.Err() != nil {
		return trailer, err // the caller's end says nothing about the replica
	}
	if err == nil {
		c.record(a.e.addr, nil, "")
		return "", nil
	}
	code := status.Code(err)
	var moved *movedError
	switch {
	case code != codes.Canceled && code != codes.DeadlineExceeded:
		c.record(a.e.addr, err, trailer)
		return trailer, err
	case errors.As(cause, &moved):
		return moved.to, status.Errorf(codes.Unavailable, "leaderconn: call to coordinator replica %s canceled: %v", moved.from, moved)
	case a.timeout != nil && code == codes.DeadlineExceeded:
		// The caller's deadline is later, so this is the probe's: gRPC
		// may see it pass (or the server may) before ctx's timer fires
		// and sets the cause.
		err = status.Errorf(codes.Unavailable, "leaderconn: %v", a.timeout)
		c.record(a.e.addr, err, "")
		c.redial(a.e.addr)
		return "", err
	}
	return trailer, err
}

// redial drops the connection to addr, whose probe got no answer in time,
// so that the next call there dials anew. A partition leaves the old TCP
// connection open, its retransmissions backed off for seconds after the
// network heals, and gRPC keeps using it until keepalive (20 s) gives up:
// a node whose blip healed found its leader only after its node timeout.
// A fresh connection's SYN goes out at once.
// The old connection is closed retireAfter later (or by Close): closing it
// at once would fail the calls still on it before the target's move
// cancels them, and so hide the move from them.
func (c *Conn) redial(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cc := c.conns[addr]
	if cc == nil || c.closed {
		return
	}
	delete(c.conns, addr)
	c.retired[cc] = time.AfterFunc(retireAfter, func() {
		c.mu.Lock()
		_, ok := c.retired[cc]
		delete(c.retired, cc)
		c.mu.Unlock()
		if ok {
			_ = cc.Close()
		}
	})
}

// retireAfter is how long a dropped connection lives on (redial).
const retireAfter = 2 * time.Second

// retry is one call's search for the leader: the failover window since
// its first Unavailable and its backoff.
type retry struct {
	c       *Conn
	start   time.Time
	backoff time.Duration
	hops    int   // redirects followed without a pause
	answer  error // the last Unavailable a replica itself gave (not the network)
}

// result is what a call that gives up returns: err, or, when err is the
// network's (a replica down) or the caller's deadline, the last answer of
// a replica that is up — it says why (an election, no majority) where a
// refused connection or a deadline does not.
func (r *retry) result(err error) error {
	if r.answer == nil {
		return err
	}
	if status.Code(err) == codes.Unavailable && !answered(err) || status.Code(err) == codes.DeadlineExceeded {
		return r.answer
	}
	return err
}

// unverified says whether err is a replica that failed the TLS check
// (another CA, a wrong pin): trying again, or another replica of the same
// set, cannot help, and nothing was sent.
func unverified(err error) bool {
	m := status.Convert(err).Message()
	return strings.Contains(m, "authentication handshake failed") || strings.Contains(m, "x509: ") || strings.Contains(m, "jobtls: ")
}

// answered says whether an Unavailable came from a replica (its own
// message) rather than from the network or gRPC's transport, or a probe
// that got no answer in time.
func answered(err error) bool {
	m := status.Convert(err).Message()
	for _, s := range []string{"connection error", "transport", "leaderconn: dial", "error reading from server", "the coordinator's leader moved", " did not answer /"} {
		if strings.Contains(m, s) {
			return false
		}
	}
	return true
}

// next moves the target on after an attempt in e failed with err and
// hint, and waits as needed; false when the call must return err: not
// Unavailable, ctx done or the window over.
func (r *retry) next(ctx context.Context, e *epoch, hint string, err error) bool {
	if status.Code(err) != codes.Unavailable || unverified(err) {
		return false
	}
	if answered(err) {
		r.answer = err
	}
	r.c.failed(e, hint)
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
	if hint != "" && hint != e.addr && r.hops < 3 {
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
		e, cc, probe, err := c.current(method)
		if errors.Is(err, ErrClosed) {
			return err
		}
		var hint string
		if err == nil {
			var trailer metadata.MD
			a := e.begin(ctx, method, probe)
			err = cc.Invoke(a.ctx, method, args, reply, append(opts[:len(opts):len(opts)], grpc.Trailer(&trailer))...)
			hint, err = a.end(c, ctx, err, c.leaderHint(trailer))
		} else {
			// A replica that cannot be dialled is as good as down.
			err = status.Error(codes.Unavailable, err.Error())
			c.record(e.addr, err, "")
		}
		if err == nil || !r.next(ctx, e, hint, err) {
			return r.result(err)
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
		e, a, cs, hint, err := s.open()
		if err == nil {
			s.cs, s.a = cs, a
			return s, nil
		}
		if errors.Is(err, ErrClosed) || !r.next(ctx, e, hint, err) {
			return nil, r.result(err)
		}
	}
}

// open opens the call on the target, in an attempt that ends when the
// stream fails or the caller's context is done; on error, the epoch it
// was tried in and the hint for the retry.
func (s *stream) open() (*epoch, *attempt, grpc.ClientStream, string, error) {
	e, cc, _, err := s.c.current(s.method)
	if errors.Is(err, ErrClosed) {
		return e, nil, nil, "", err
	}
	if err != nil {
		err = status.Error(codes.Unavailable, err.Error())
		s.c.record(e.addr, err, "")
		return e, nil, nil, "", err
	}
	a := e.begin(s.ctx, s.method, 0)
	cs, err := cc.NewStream(a.ctx, s.desc, s.method, s.opts...)
	if err != nil {
		hint, err := a.end(s.c, s.ctx, err, "")
		return e, nil, nil, hint, err
	}
	// The caller may abandon the stream by canceling its context, without
	// a receive that fails: stop watching the epoch then.
	context.AfterFunc(a.ctx, func() { a.stop() })
	return e, a, cs, "", nil
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
	a         *attempt // cs's
	sent      []any
	closeSent bool
	received  bool
}

func (s *stream) cur() (grpc.ClientStream, *attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cs, s.a
}

func (s *stream) Context() context.Context { cs, _ := s.cur(); return cs.Context() }
func (s *stream) Trailer() metadata.MD     { cs, _ := s.cur(); return cs.Trailer() }

// failedOn is err, a failure of cs in attempt a, as the caller is to see
// it, and the hint for where the leader is.
func (s *stream) failedOn(cs grpc.ClientStream, a *attempt, err error) (string, error) {
	return a.end(s.c, s.ctx, err, s.c.leaderHint(cs.Trailer()))
}

func (s *stream) Header() (metadata.MD, error) {
	cs, a := s.cur()
	md, err := cs.Header()
	if err != nil {
		var hint string
		if hint, err = s.failedOn(cs, a, err); status.Code(err) == codes.Unavailable {
			s.c.failed(a.e, hint)
		}
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
	cs, a := s.cur()
	err := cs.RecvMsg(m)
	var hint string
	switch {
	case err != nil:
		hint, err = s.failedOn(cs, a, err)
	case !s.desc.ServerStreams:
		a.end(s.c, s.ctx, nil, "") // the one reply has come: the call is over
	default:
		s.c.record(a.e.addr, nil, "")
	}
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
		s.c.failed(a.e, hint)
		return err
	}
	// Nothing has arrived: open the call again where the leader is now.
	r := retry{c: s.c}
	e := a.e
	for r.next(s.ctx, e, hint, err) {
		e, a, cs, hint, err = s.open()
		if errors.Is(err, ErrClosed) {
			return err
		}
		if err == nil {
			s.resend(cs)
			if err = cs.RecvMsg(m); err != nil {
				hint, err = s.failedOn(cs, a, err)
			} else {
				s.c.record(a.e.addr, nil, "")
			}
			s.mu.Lock()
			s.cs, s.a = cs, a
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
