package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Attach claims: the agent checks workers' attach claims against what it
// started. A worker's hello says which
// rank, pid and generation it is, a standby's which slot. The job token
// alone let any process that holds it (every worker does) say anything: take
// another rank's place in progress reports and stack dumps, or another
// process's stream (the agent parks and resumes workers through it), or a
// standby's slot. Now a hello must match a process this agent started:
//
//   - the connection's peer is the process the hello names: on Linux the
//     kernel says who connected (SO_PEERCRED on the unix socket, taken at
//     accept by peerCredentials and read from grpc's peer info);
//   - that pid is one the agent started (or a process in the process group
//     of one: supervise starts each in its own group, so a worker may be
//     run by a wrapper that forks it);
//   - a rank's hello names that process's rank and generation; a standby's
//     names that standby's slot.
//
// Anything else is refused with PermissionDenied, saying what did not
// match, and logged.

// Proc is what the agent started as one process: a rank's worker of a
// generation, or the standby of a slot.
type Proc struct {
	Rank    int
	Local   int // local rank (the output's filters)
	Gen     int64
	Standby bool
	Slot    int
}

func (p Proc) String() string {
	if p.Standby {
		return fmt.Sprintf("the standby of slot %d", p.Slot)
	}
	return fmt.Sprintf("rank %d of generation %d", p.Rank, p.Gen)
}

// Claims holds what every live process the agent started is, by pid. The
// agent's loop writes it before a process can say hello as what it
// is now; the relay's Attach handlers read it.
type Claims struct {
	mu      sync.Mutex
	procs   map[int]Proc
	changed chan struct{} // closed and replaced on every change
	// wait is how long a hello from a pid not (yet) known waits for the loop
	// to record it: a process may connect before its start was recorded.
	wait time.Duration
}

// claimWait is claims.wait's default.
const claimWait = 5 * time.Second

// NewClaims returns claims of no process.
func NewClaims() *Claims {
	return &Claims{procs: map[int]Proc{}, changed: make(chan struct{}), wait: claimWait}
}

// Set records that pid is p.
func (c *Claims) Set(pid int, p Proc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs[pid] = p
	close(c.changed)
	c.changed = make(chan struct{})
}

// Forget drops pid once its exit was taken.
func (c *Claims) Forget(pid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.procs, pid)
}

// lookup returns what pid is: the process the agent started with that pid,
// or, failing that, the one that leads pid's process group. It waits up to
// c.wait for the loop to record a pid it does not know yet.
func (c *Claims) lookup(ctx context.Context, pid int) (Proc, int, bool) {
	t := time.NewTimer(c.wait)
	defer t.Stop()
	pgid, _ := unix.Getpgid(pid)
	for {
		c.mu.Lock()
		p, ok := c.procs[pid]
		leader := pid
		if !ok && pgid > 0 && pgid != pid {
			p, ok = c.procs[pgid]
			leader = pgid
		}
		changed := c.changed
		c.mu.Unlock()
		if ok {
			return p, leader, true
		}
		select {
		case <-changed:
		case <-t.C:
			return Proc{}, 0, false
		case <-ctx.Done():
			return Proc{}, 0, false
		}
	}
}

// known returns what pid is, as lookup does, without waiting.
func (c *Claims) known(pid int) (Proc, int, bool) {
	pgid, _ := unix.Getpgid(pid)
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.procs[pid]; ok {
		return p, pid, true
	}
	if p, ok := c.procs[pgid]; ok && pgid > 0 {
		return p, pgid, true
	}
	return Proc{}, 0, false
}

// AuthorizeSnapshots lets pid keep rank's snapshots if it is the worker
// the agent started as that rank (or a process in its process group).
func (c *Claims) AuthorizeSnapshots(ctx context.Context, pid, rank int) error {
	p, leader, ok := c.lookup(ctx, pid)
	switch {
	case !ok:
		return fmt.Errorf("pid %d is no worker of this agent", pid)
	case p.Standby:
		return fmt.Errorf("pid %d is %s, which has no rank yet", pid, p)
	case p.Rank != rank:
		return fmt.Errorf("pid %d is %s (pid %d)", pid, p, leader)
	}
	return nil
}

// errClaim is a hello that does not match what the agent started.
var errClaim = errors.New("attach: the hello does not match a process this agent started")

// check verifies hello against the connection's peer (peerPid, 0 when the
// platform cannot say) and what the agent started. It returns the process
// the hello comes from.
func (c *Claims) check(ctx context.Context, hello *gotrainv1.WorkerHello, peerPid int) (Proc, error) {
	pid := int(hello.GetPid())
	if peerPid != 0 && pid != peerPid {
		return Proc{}, fmt.Errorf("%w: it claims pid %d but comes from pid %d", errClaim, pid, peerPid)
	}
	if pid <= 0 {
		return Proc{}, fmt.Errorf("%w: it claims pid %d", errClaim, pid)
	}
	p, leader, ok := c.lookup(ctx, pid)
	if !ok {
		return Proc{}, fmt.Errorf("%w: pid %d is no worker or standby of this agent", errClaim, pid)
	}
	switch {
	case hello.GetStandby() && (!p.Standby || int(hello.GetStandbySlot()) != p.Slot):
		return p, fmt.Errorf("%w: pid %d claims the standby of slot %d but is %s (pid %d)", errClaim, pid, hello.GetStandbySlot(), p, leader)
	case !hello.GetStandby() && (p.Standby || int(hello.GetRank()) != p.Rank || hello.GetGeneration() != p.Gen):
		return p, fmt.Errorf("%w: pid %d claims rank %d of generation %d but is %s (pid %d)", errClaim, pid, hello.GetRank(), hello.GetGeneration(), p, leader)
	}
	return p, nil
}

// checkHello is the relay's check of a stream's first hello: a refusal is
// logged and returned as PermissionDenied.
func (r *Server) checkHello(ctx context.Context, hello *gotrainv1.WorkerHello) error {
	if r.Claims == nil {
		return nil
	}
	peerPid := peerPidOf(ctx)
	if _, err := r.Claims.check(ctx, hello, peerPid); err != nil {
		if r.Log != nil {
			r.Log.Warn("attach refused", "err", err, "peer_pid", peerPid)
		}
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// peerCredentials are the agent socket's transport credentials: no
// handshake, but each connection's peer process as the kernel tells it
// (SO_PEERCRED), for the handlers to read from grpc's peer info
// (peerPidOf). Workers dial with insecure credentials, as before.
type peerCredentials struct{}

var _ credentials.TransportCredentials = peerCredentials{}

// peerCred is a connection's AuthInfo: the connecting process.
type peerCred struct {
	credentials.CommonAuthInfo
	Pid, UID, GID int
}

func (peerCred) AuthType() string { return "peercred" }

func (peerCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	if pid, uid, gid, ok := connPeer(conn); ok { // peercred_linux.go
		info.Pid, info.UID, info.GID = pid, uid, gid
	}
	return conn, info, nil
}

func (peerCredentials) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}
func (c peerCredentials) Clone() credentials.TransportCredentials { return c }
func (peerCredentials) OverrideServerName(string) error           { return nil }

// peerPidOf returns the pid of the process at the other end of ctx's
// stream; 0 when unknown.
func peerPidOf(ctx context.Context) int {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return 0
	}
	if pc, ok := p.AuthInfo.(peerCred); ok {
		return pc.Pid
	}
	return 0
}
