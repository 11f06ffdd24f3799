package launcher

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

// Attach claims (issue 16 item 10; item 2's "the agent checks workers'
// Attach claims against what it started"). A worker's hello says which
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

// startedProc is what the agent started as one process: a rank's worker of
// a generation, or the standby of a slot.
type startedProc struct {
	rank    int
	local   int // local rank (the output's filters: output.go)
	gen     int64
	standby bool
	slot    int
}

func (p startedProc) String() string {
	if p.standby {
		return fmt.Sprintf("the standby of slot %d", p.slot)
	}
	return fmt.Sprintf("rank %d of generation %d", p.rank, p.gen)
}

// claims holds what every live process the agent started is, by pid. The
// loop writes it (actions.go) before a process can say hello as what it
// is now; the relay's Attach handlers read it.
type claims struct {
	mu      sync.Mutex
	procs   map[int]startedProc
	changed chan struct{} // closed and replaced on every change
	// wait is how long a hello from a pid not (yet) known waits for the loop
	// to record it: a process may connect before its start was recorded.
	wait time.Duration
}

// claimWait is claims.wait's default.
const claimWait = 5 * time.Second

func newClaims() *claims {
	return &claims{procs: map[int]startedProc{}, changed: make(chan struct{}), wait: claimWait}
}

// set records that pid is p.
func (c *claims) set(pid int, p startedProc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs[pid] = p
	close(c.changed)
	c.changed = make(chan struct{})
}

// forget drops pid once its exit was taken.
func (c *claims) forget(pid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.procs, pid)
}

// lookup returns what pid is: the process the agent started with that pid,
// or, failing that, the one that leads pid's process group. It waits up to
// c.wait for the loop to record a pid it does not know yet.
func (c *claims) lookup(ctx context.Context, pid int) (startedProc, int, bool) {
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
			return startedProc{}, 0, false
		case <-ctx.Done():
			return startedProc{}, 0, false
		}
	}
}

// errClaim is a hello that does not match what the agent started.
var errClaim = errors.New("attach: the hello does not match a process this agent started")

// check verifies hello against the connection's peer (peerPid, 0 when the
// platform cannot say) and what the agent started. It returns the process
// the hello comes from.
func (c *claims) check(ctx context.Context, hello *gotrainv1.WorkerHello, peerPid int) (startedProc, error) {
	pid := int(hello.GetPid())
	if peerPid != 0 && pid != peerPid {
		return startedProc{}, fmt.Errorf("%w: it claims pid %d but comes from pid %d", errClaim, pid, peerPid)
	}
	if pid <= 0 {
		return startedProc{}, fmt.Errorf("%w: it claims pid %d", errClaim, pid)
	}
	p, leader, ok := c.lookup(ctx, pid)
	if !ok {
		return startedProc{}, fmt.Errorf("%w: pid %d is no worker or standby of this agent", errClaim, pid)
	}
	switch {
	case hello.GetStandby() && (!p.standby || int(hello.GetStandbySlot()) != p.slot):
		return p, fmt.Errorf("%w: pid %d claims the standby of slot %d but is %s (pid %d)", errClaim, pid, hello.GetStandbySlot(), p, leader)
	case !hello.GetStandby() && (p.standby || int(hello.GetRank()) != p.rank || hello.GetGeneration() != p.gen):
		return p, fmt.Errorf("%w: pid %d claims rank %d of generation %d but is %s (pid %d)", errClaim, pid, hello.GetRank(), hello.GetGeneration(), p, leader)
	}
	return p, nil
}

// checkHello is the relay's check of a stream's first hello: a refusal is
// logged and returned as PermissionDenied.
func (r *relay) checkHello(ctx context.Context, hello *gotrainv1.WorkerHello) error {
	if r.claims == nil {
		return nil
	}
	peerPid := peerPidOf(ctx)
	if _, err := r.claims.check(ctx, hello, peerPid); err != nil {
		if r.log != nil {
			r.log.Warn("attach refused", "err", err, "peer_pid", peerPid)
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
