package coordinator

import (
	"context"
	"encoding/base64"
	"log/slog"
	"net"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/state"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The replica set's keys. The job CA's key is random and held
// only by the replicas: it signs node certificates, replica certificates
// (Raft's mutual TLS admits only those) and the followers' leader hints.
// A new replica gets it from the set over an authenticated channel
// (ReplicaCA), never from the job token, which any worker holds:
//
//   - embedded: only the node the replicated state asked to host a replica
//     (a HostReplica event, or Join's host_replica), whose connection
//     presents that node's certificate, and whose replica is not in the
//     set yet;
//   - standalone (--peers): a caller from the host of a listed peer whose
//     connection proved the job token (see SECURITY.md for what that
//     leaves open).

// replicaKeys decides who may have the replica set's keys (see above),
// and signs the followers' leader hints. Set before Serve, read only
// after.
type replicaKeys struct {
	ca    *jobtls.CA // nil: no job CA (plaintext tests)
	self  string     // this replica's id (its gRPC address)
	fixed []string   // standalone: the replica set --peers lists
}

// ReplicaCA hands the job CA to a replica about to start (see above).
// Any replica answers, from its own state: a standalone set has no leader
// before its replicas start.
func (s *Server) ReplicaCA(ctx context.Context, req *gotrainv1.ReplicaCARequest) (*gotrainv1.ReplicaCAResponse, error) {
	if s.repl == nil || s.keys.ca == nil {
		return nil, status.Error(codes.FailedPrecondition, "replica CA: this coordinator is not replicated with a job CA")
	}
	s.mu.Lock()
	err := s.keys.mayHaveCA(ctx, req.GetNodeId(), s.st)
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("the job CA refused to a caller that is not a replica to be", "node_id", req.GetNodeId(), "caller", callerAddr(ctx), "err", status.Convert(err).Message())
		return nil, err
	}
	cert, key, err := s.keys.ca.MarshalCA()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.log.Info("the job CA handed to a new replica", "node_id", req.GetNodeId(), "caller", callerAddr(ctx))
	return &gotrainv1.ReplicaCAResponse{CaCert: cert, CaKey: key}, nil
}

// mayHaveCA says whether the caller of ctx may have the job CA: see the
// top of this file. Server.mu is held (st).
func (k replicaKeys) mayHaveCA(ctx context.Context, nodeID string, st *state.State) error {
	if len(k.fixed) > 0 {
		host := callerHost(ctx)
		for _, p := range k.fixed {
			if h, _, err := net.SplitHostPort(p); err == nil && h == host && p != k.self {
				return nil
			}
		}
		return status.Errorf(codes.PermissionDenied, "replica CA: the caller at %s is not on the host of a replica --peers lists (%v)", host, k.fixed)
	}
	return askedNotAdded(st, callerNode(ctx), nodeID, "replica CA")
}

// askedNotAdded: only a node the replicated state st asked to host a
// replica, whose replica is not in the set yet, calling with its own node
// certificate (caller), may have the CA or be added. Server.mu is held.
func askedNotAdded(st *state.State, caller, nodeID, what string) error {
	switch {
	case caller == "":
		return status.Errorf(codes.PermissionDenied, "%s: only a node's agent, with its node certificate, may ask", what)
	case caller != nodeID:
		return status.Errorf(codes.PermissionDenied, "%s: this connection's certificate is node %q's, but the request is for node %q", what, caller, nodeID)
	case !st.Asked(nodeID) || !st.Machine().HasNode(nodeID):
		return status.Errorf(codes.PermissionDenied, "%s: node %q was not asked to host a replica of the coordinator", what, nodeID)
	case st.Hosts(nodeID):
		return status.Errorf(codes.PermissionDenied, "%s: node %q hosts a replica of the set already", what, nodeID)
	}
	return nil
}

// mayAdd checks an AddReplica (askedNotAdded), and that the replica's
// gRPC and Raft addresses are on the node's own host. Server.mu is held.
func (k replicaKeys) mayAdd(ctx context.Context, req *gotrainv1.AddReplicaRequest, st *state.State) error {
	caller := callerNode(ctx)
	if k.ca == nil {
		caller = req.GetNodeId() // plaintext tests: no identities
	}
	if err := askedNotAdded(st, caller, req.GetNodeId(), "add replica"); err != nil {
		return err
	}
	home := st.Machine().NodeAddress(req.GetNodeId())
	for _, a := range []string{req.GetAddr(), req.GetRaftAddr()} {
		h, _, err := net.SplitHostPort(a)
		if err != nil || h != home {
			return status.Errorf(codes.PermissionDenied, "add replica: node %q's replica address %q is not on its own host %s", req.GetNodeId(), a, home)
		}
	}
	return nil
}

// hint is leaderconn.NotLeader's proof that the replica set names leader
// in Raft's term: the job CA's signature of both
// (leaderconn.HintMessage), which an agent checks against the CA it
// pinned. nil without a CA (plaintext tests).
func (k replicaKeys) hint(leader string, term uint64, log *slog.Logger) []string {
	if k.ca == nil || leader == "" {
		return nil
	}
	sig, err := k.ca.Sign(leaderconn.HintMessage(leader, term))
	if err != nil {
		log.Warn("sign the leader hint", "err", err)
		return nil
	}
	return []string{leaderconn.TermKey, strconv.FormatUint(term, 10), leaderconn.SigKey, base64.StdEncoding.EncodeToString(sig)}
}

// callerAddr is the caller's network address, for logs.
func callerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// callerHost is the caller's IP address.
func callerHost(ctx context.Context) string {
	h, _, err := net.SplitHostPort(callerAddr(ctx))
	if err != nil {
		return ""
	}
	return h
}
