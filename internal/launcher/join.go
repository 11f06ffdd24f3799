package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// join registers this node, retrying while the coordinator is not up yet,
// and returns the node certificate the coordinator issued for csr.
func (a *agent) join(ctx context.Context, coordAddr string, csr []byte) (_ []byte, _ jobtls.Proven, caDER []byte, _ error) {
	cert, p, err := a.joinOnce(ctx, coordAddr, csr)
	var proven jobtls.Proven
	if p != nil {
		proven, _ = p.AuthInfo.(jobtls.Proven)
	}
	return cert, proven, a.joinCA, err
}

func (a *agent) joinOnce(ctx context.Context, coordAddr string, csr []byte) ([]byte, *peer.Peer, error) {
	port := a.cfg.MasterPort
	if port == 0 {
		p, err := freePort(a.cfg.NodeAddress)
		if err != nil {
			return nil, nil, err
		}
		port = p
	}
	req := &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{
		Hostname: a.host, Address: a.cfg.NodeAddress, Nproc: int32(a.cfg.NprocPerNode),
		AgentPid: int32(os.Getpid()), FreePort: int32(port), Gpus: a.place.JoinGPUs(),
		RanksPerGpu: int32(a.cfg.RanksPerGPU), PreflightFailure: a.preflightFailure,
	}, Settings: a.cfg.JobSettings.Given(a.cfg.JobFlagsGiven), Csr: csr, HostKey: a.hostKey}
	if r := a.cfg.NodeRank; r != nil {
		req.Node.NodeRank = proto.Int32(int32(*r)) // the scheduler's node order (internal/coordinator/job's order.go)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
	defer cancel()
	backoff := 50 * time.Millisecond
	a.nodeTimeout = a.cfg.NodeTimeout                            // until Join says the job's
	a.setPhase(ctx, "waiting for the coordinator at "+coordAddr) // launcher.go
	var why atomic.Pointer[string]                               // the last try's failure, for the waiting line
	defer a.sayWaiting(ctx, coordAddr, func() string {
		// A try can take longer than progressEvery (a replica set's
		// connection looks for a leader for 15 s): a TCP probe says at
		// once what blocks the way; past TCP, the last try's failure does.
		if r := probeReach(ctx, splitAddrs(coordAddr)); r != "" {
			return r
		}
		if w := why.Load(); w != nil {
			return *w
		}
		return ""
	})()
	for {
		var p peer.Peer // the connection's proof and the CA it presented (keys.go)
		resp, err := a.coord.Join(ctx, req, grpc.Peer(&p))
		if err != nil {
			w := unreachableWhy(status.Convert(err).Message())
			why.Store(&w)
		}
		if err == nil {
			a.nodeID = resp.GetNodeId()
			if ms := resp.GetNodeTimeoutMs(); ms > 0 {
				a.nodeTimeout = time.Duration(ms) * time.Millisecond // the job's, for the reconnects
			}
			for _, w := range resp.GetWarnings() {
				fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: %s\n", w)
			}
			a.gossipPort = int(resp.GetGossipPort())
			a.learnReplicas(resp.GetReplicas()) // replicas.go
			a.hostReplica = resp.GetHostReplica()
			if id := resp.GetRunId(); id != "" && id != a.cfg.RunID {
				a.log.Info("taking the coordinator's run id", "run_id", id, "ours", a.cfg.RunID)
				a.cfg.RunID = id // every node's workers see the same TORCHELASTIC_RUN_ID
			}
			if len(resp.GetNodeCert()) == 0 {
				return nil, nil, fmt.Errorf("join the coordinator at %s: it issued no node certificate (a coordinator of an older gotrain?)", coordAddr)
			}
			a.joinCA = resp.GetCaCert()
			return resp.GetNodeCert(), &p, nil
		}
		if errors.Is(err, jobtls.ErrProofRefused) || strings.Contains(status.Convert(err).Message(), jobtls.ErrProofRefused.Error()) || status.Code(err) == codes.PermissionDenied {
			return nil, nil, fmt.Errorf("join the coordinator at %s: wrong job token: set %s (or --job-token-file) to the token of the first node or `gotrain coordinator` (the job token is in the 0600 file its start line names): %w",
				coordAddr, jobenv.JobToken, err)
		}
		if containsNewIdentity(err) { // keys.go: at first contact, the pin given is not this coordinator's
			return nil, nil, wrongCAHash(coordAddr, err)
		}
		if notVerified(err) { // tls.go: nothing it could use was sent, and trying again cannot help
			return nil, nil, fmt.Errorf("join the coordinator at %s: it is not the coordinator this node was told to trust, so nothing of the job token was sent: %s", coordAddr, verifyFailure(err))
		}
		if status.Code(err) == codes.FailedPrecondition {
			// A setting that contradicts the job's, or a job already
			// started: the coordinator's message says what to do.
			return nil, nil, &joinRefused{addr: coordAddr, err: err}
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return nil, nil, fmt.Errorf("join the coordinator at %s: %w", coordAddr, err)
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("join the coordinator at %s: not reachable within %s (is it running? check --coordinator): %w", coordAddr, a.cfg.JoinTimeout, err)
		case <-time.After(backoff):
		}
		// At most a second between tries: a node joins within a second of
		// its coordinator listening.
		backoff = min(2*backoff, time.Second)
	}
}

// sayWaiting says every progressEvery that this node still waits for its
// coordinator, and why (from why), until the returned stop is called (it
// returns once the sayer has). Its own clock, not the tries': one try can
// outlast progressEvery (a replica set's connection looks for a leader for
// 15 s).
func (a *agent) sayWaiting(ctx context.Context, coordAddr string, why func() string) (stop func()) {
	start := time.Now()
	return sayEvery(ctx, progressEvery, func() {
		reason := ""
		if w := why(); w != "" {
			reason = ": " + w
		}
		fmt.Fprintf(a.cfg.Stderr, "gotrain: waiting for the coordinator at %s%s (%s so far, giving up after --join-timeout %s)\n",
			coordAddr, reason, time.Since(start).Round(time.Second), a.cfg.JoinTimeout)
	})
}

// sayEvery calls say every period until ctx ends or the returned stop is
// called; stop returns once say will not be called again.
func sayEvery(ctx context.Context, period time.Duration, say func()) (stop func()) {
	done, over := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(over)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				say()
			}
		}
	}()
	return func() { close(done); <-over }
}

// progressEvery is how often an agent that waits (for its coordinator, for
// the other nodes) says so.
var progressEvery = 10 * time.Second // a variable for tests

// waitForStart says every progressEvery, until the job's first generation
// starts here (started closes), how many nodes have joined, so that a
// person watching a node knows what it waits for. It returns when ctx ends
// or the job started.
func (a *agent) waitForStart(ctx context.Context, started <-chan struct{}) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-started:
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := a.coord.GetJobStatus(rctx, &gotrainv1.GetJobStatusRequest{})
		cancel()
		if err != nil || st.GetState() != "waiting" {
			continue
		}
		var hosts []string
		for _, n := range st.GetNodes() {
			hosts = append(hosts, n.GetInfo().GetHostname())
		}
		fmt.Fprintf(a.cfg.Stderr, "gotrain: %d of %s nodes joined (%s); waiting for %s more\n",
			len(hosts), a.nnodes(), strings.Join(hosts, ", "), a.missing(len(hosts)))
	}
}

// nnodes is the job's --nnodes as the user wrote it.
func (a *agent) nnodes() string {
	if a.cfg.MinNodes == 0 || a.cfg.MinNodes == a.cfg.Nodes {
		return fmt.Sprint(a.cfg.Nodes)
	}
	return fmt.Sprintf("%d:%d", a.cfg.MinNodes, a.cfg.Nodes)
}

// missing says how many more nodes the job waits for when n have joined.
func (a *agent) missing(n int) string {
	min := a.cfg.MinNodes
	if min == 0 {
		min = a.cfg.Nodes
	}
	if n < min {
		return fmt.Sprint(min - n)
	}
	return fmt.Sprintf("up to %d", a.cfg.Nodes-n)
}

// joinRefused is a Join the coordinator refused for good: it reads as the
// coordinator's message, without gRPC's "rpc error: code = ..." around it.
type joinRefused struct {
	addr string
	err  error
}

func (e *joinRefused) Error() string {
	return fmt.Sprintf("join the coordinator at %s: %s", e.addr, status.Convert(e.err).Message())
}

func (e *joinRefused) Unwrap() error { return e.err }

// identityHashes finds the two hashes in jobtls's IdentityError, which gRPC
// hands on as text: the CA the coordinator presented, and the pin.
var identityHashes = regexp.MustCompile(`CA hash (sha256:[0-9a-f]+), was (sha256:[0-9a-f]+)`)

// wrongCAHash is a first contact with a coordinator that proves the job
// token but presents another CA than --ca-hash: the hash given is not this
// coordinator's (mistyped, or copied from an earlier start of the first
// node). The coordinator did not restart under this node: it never knew it.
func wrongCAHash(coordAddr string, err error) error {
	m := identityHashes.FindStringSubmatch(verifyFailure(err))
	if m == nil {
		return fmt.Errorf("join the coordinator at %s: --ca-hash does not match the coordinator's certificate (%s): copy --ca-hash from the first node's line \"start the other node(s) with: …\", or leave it out: the job token alone proves the coordinator", coordAddr, verifyFailure(err))
	}
	return fmt.Errorf("join the coordinator at %s: --ca-hash %s does not match the coordinator's certificate, whose CA hash is %s (it proves the job token, so it is this job's coordinator: the hash given is mistyped, or from an earlier start of the first node); "+
		"copy --ca-hash from the first node's line \"start the other node(s) with: …\" or its run file, or leave --ca-hash out: the job token alone proves the coordinator", coordAddr, m[2], m[1])
}

// probeTimeout bounds one TCP probe of a coordinator address.
const probeTimeout = 3 * time.Second

// probeReach opens (and closes) a TCP connection to each address and says
// why those that cannot be reached cannot ("" when all can).
func probeReach(ctx context.Context, addrs []string) string {
	var whys []string
	for _, addr := range addrs {
		d := net.Dialer{Timeout: probeTimeout}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			continue
		}
		if ctx.Err() != nil {
			return ""
		}
		w := unreachableWhy(err.Error())
		var dns *net.DNSError
		if errors.As(err, &dns) && !dns.IsNotFound {
			// The resolver itself failed (no DNS server answers): still the name.
			w = "its name does not resolve (DNS: " + dns.Err + "); check the host in --coordinator and this node's resolver"
		}
		if len(addrs) > 1 {
			w = addr + ": " + w
		}
		whys = append(whys, w)
	}
	return strings.Join(whys, "; ")
}

// unreachableWhy says in a person's words why a try to reach the coordinator
// failed, from the gRPC message of its error: the three causes a user can
// act on apart (the name, nothing listening, no answer), else the message.
func unreachableWhy(msg string) string {
	switch {
	case strings.Contains(msg, "no such host") || strings.Contains(msg, "produced zero addresses"):
		return "its name does not resolve (DNS: no such host); check the host in --coordinator"
	case strings.Contains(msg, "server misbehaving"):
		return "its name does not resolve (DNS: the server failed); check the host in --coordinator and this node's resolver"
	case strings.Contains(msg, "connection refused"):
		return "connection refused (nothing listens at that port yet: is the first node or `gotrain coordinator` running? check the port in --coordinator)"
	case strings.Contains(msg, "no route to host") || strings.Contains(msg, "network is unreachable"):
		return "no route to that address (check the address in --coordinator and this node's network)"
	case strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "timed out") || strings.Contains(msg, "leaderconn: "):
		return "no answer (timeout): the address may be wrong, its host down, or a firewall dropping the packets"
	}
	return msg
}
