package coordinator

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/replica"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The replica set of a replicated coordinator (replicated.go): standalone,
// fixed by --peers; embedded, the first node's replica and those the next
// nodes host at Join's request, a lost one replaced by another node's.
// The set is replicated state (package state); here: Raft's voters.

// reconcileVoters takes replicas that left the set out of Raft's
// configuration (on the leader).
func (s *Server) reconcileVoters() {
	s.mu.Lock()
	peers := s.st.Peers()
	s.mu.Unlock()
	for _, p := range s.repl.Peers() {
		if !slices.Contains(peers, p.ID) {
			if err := s.repl.RemoveVoter(p.ID); err != nil {
				s.log.Warn("take a lost replica out of the set", "addr", p.ID, "err", err)
			}
		}
	}
}

// replicaAddrs is the replica set peers as the leader self hands it out,
// itself first; nil when the coordinator is not replicated (self nil).
func replicaAddrs(self *replica.Node, peers []string) []string {
	if self == nil {
		return nil
	}
	addrs := []string{self.ID()}
	for _, p := range peers {
		if p != self.ID() {
			addrs = append(addrs, p)
		}
	}
	return addrs
}

// AddReplica adds the replica a node started at the leader's request:
// only that node, calling with its own node certificate, not yet in the
// set, and with its replica on its own host (mayAddReplica); anyone else
// is refused and nothing reaches the log.
func (s *Server) AddReplica(ctx context.Context, req *gotrainv1.AddReplicaRequest) (*gotrainv1.AddReplicaResponse, error) {
	if s.repl == nil {
		return nil, status.Error(codes.FailedPrecondition, "add replica: this coordinator is not replicated (--coordinator-replicas 1)")
	}
	s.mu.Lock()
	err := s.keys.mayAdd(ctx, req, s.st) // replicakeys.go
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("add replica refused", "node_id", req.GetNodeId(), "addr", req.GetAddr(), "caller", callerAddr(ctx), "err", status.Convert(err).Message())
		return nil, err
	}
	if err := s.repl.AddVoter(replica.Peer{ID: req.GetAddr(), RaftAddr: req.GetRaftAddr()}); err != nil {
		return nil, err
	}
	if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Replica{Replica: &gotrainv1.LogReplica{Addr: req.GetAddr(), NodeId: req.GetNodeId()}}}); err != nil {
		return nil, err
	}
	return &gotrainv1.AddReplicaResponse{}, nil
}
