package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
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
		req.Node.NodeRank = proto.Int32(int32(*r)) // the scheduler's node order (coordinator/job's order.go)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
	defer cancel()
	backoff := 50 * time.Millisecond
	a.nodeTimeout = a.cfg.NodeTimeout                            // until Join says the job's
	a.setPhase(ctx, "waiting for the coordinator at "+coordAddr) // launcher.go
	defer a.sayWaiting(ctx, coordAddr)()
	for {
		var p peer.Peer // the connection's proof and the CA it presented (keys.go)
		resp, err := a.coord.Join(ctx, req, grpc.Peer(&p))
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
// coordinator, until the returned stop is called (it returns once the
// sayer has). Its own clock, not the tries': one try can outlast
// progressEvery (a replica set's connection looks for a leader for 15 s).
func (a *agent) sayWaiting(ctx context.Context, coordAddr string) (stop func()) {
	start := time.Now()
	done, over := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(over)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				fmt.Fprintf(a.cfg.Stderr, "gotrain: waiting for the coordinator at %s (%s so far, giving up after --join-timeout %s)\n",
					coordAddr, time.Since(start).Round(time.Second), a.cfg.JoinTimeout)
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
