package coordinator

import (
	"context"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/coordinator/replica"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The replica set of a replicated coordinator (replicated.go): standalone,
// fixed by --peers; embedded, the first node's replica and those the next
// nodes host at Join's request, a lost one replaced by another node's.

// addPeer adds the replica at addr, hosted by node (embedded; "" when
// standalone), to the set and tells every node. s.mu is held.
func (s *Server) addPeer(addr, node string) {
	if slices.Contains(s.rs.peers, addr) {
		return
	}
	s.rs.peers = append(s.rs.peers, addr)
	if node != "" {
		s.hostReplica(addr, node)
	}
	s.log.Info("coordinator replica added", "addr", addr, "replicas", len(s.rs.peers))
	s.tellPeers()
}

// tellPeers sends every node the replica set. s.mu is held.
func (s *Server) tellPeers() {
	ev := &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Replicas{Replicas: &gotrainv1.Replicas{Addrs: slices.Clone(s.rs.peers)}}}
	for _, o := range s.outboxes {
		o.push(ev)
	}
}

// hostReplica records that node hosts the replica at addr. s.mu is held.
func (s *Server) hostReplica(addr, node string) {
	if s.rs.hostOf == nil {
		s.rs.hostOf = map[string]string{}
	}
	s.rs.hostOf[addr] = node
}

// replaceLostReplicas: a replica whose node the job lost is gone with it
// (embedded). It leaves the set, and the first node (in join order) on a
// host without a replica is asked to host one in its place (a HostReplica
// event), so that the set keeps its size and can lose one more. Every
// replica decides alike; the leader also takes the lost one out of Raft's
// configuration (reconcileVoters). s.mu is held.
func (s *Server) replaceLostReplicas() {
	if s.m.Finished() {
		return
	}
	var lost []string
	for addr, node := range s.rs.hostOf {
		if !s.m.HasNode(node) {
			lost = append(lost, addr)
		}
	}
	if len(lost) == 0 {
		return
	}
	slices.Sort(lost)
	for _, addr := range lost {
		delete(s.rs.hostOf, addr)
		s.rs.peers = slices.DeleteFunc(s.rs.peers, func(p string) bool { return p == addr })
		s.log.Warn("coordinator replica lost with its node", "addr", addr, "replicas", len(s.rs.peers))
	}
	s.tellPeers()
	ids := slices.SortedFunc(maps.Keys(s.outboxes), naturalNodeOrder)
	for _, id := range ids {
		if len(s.rs.peers)+s.pendingReplicas() >= s.rs.want {
			break
		}
		addr := s.m.NodeAddress(id)
		if slices.Contains(s.rs.askedHosts, addr) || s.peerOnHost(addr) {
			continue
		}
		s.rs.asked = append(s.rs.asked, id)
		s.rs.askedHosts = append(s.rs.askedHosts, addr)
		s.outboxes[id].push(&gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_HostReplica{HostReplica: &gotrainv1.HostReplica{}}})
		s.log.Info("a node is asked to host a coordinator replica", "node_id", id)
	}
	if s.rs.leading {
		s.bg.do(s.reconcileVoters)
	}
}

// pendingReplicas counts the nodes asked to host a replica that is not in
// the set (yet). s.mu is held.
func (s *Server) pendingReplicas() int {
	n := 0
	for _, id := range s.rs.asked {
		if s.m.HasNode(id) && !slices.Contains(slices.Collect(maps.Values(s.rs.hostOf)), id) {
			n++
		}
	}
	return n
}

// peerOnHost says whether a replica of the set runs at address. s.mu is
// held.
func (s *Server) peerOnHost(address string) bool {
	for _, p := range s.rs.peers {
		if h, _, err := net.SplitHostPort(p); err == nil && h == address {
			return true
		}
	}
	return false
}

// reconcileVoters takes replicas that left the set out of Raft's
// configuration (on the leader).
func (s *Server) reconcileVoters() {
	s.mu.Lock()
	peers := slices.Clone(s.rs.peers)
	s.mu.Unlock()
	for _, p := range s.repl.Peers() {
		if !slices.Contains(peers, p.ID) {
			if err := s.repl.RemoveVoter(p.ID); err != nil {
				s.log.Warn("take a lost replica out of the set", "addr", p.ID, "err", err)
			}
		}
	}
}

// askReplica says whether node id, at address, joining now, is to host a
// replica (embedded: the first nodes to join on a host without one, until
// Want; the first node's own agent joins first, where the first replica
// runs). s.mu is held; every replica decides alike.
func (s *Server) askReplica(id, address string) bool {
	if s.rs.want > 1 && len(s.rs.hostOf) == 0 && len(s.rs.peers) == 1 && s.peerOnHost(address) {
		s.hostReplica(s.rs.peers[0], id) // the first node: its agent joins its own coordinator first
	}
	if len(s.rs.asked)+1 >= s.rs.want || slices.Contains(s.rs.askedHosts, address) || s.peerOnHost(address) {
		return false
	}
	s.rs.asked = append(s.rs.asked, id)
	s.rs.askedHosts = append(s.rs.askedHosts, address)
	return true
}

// replicaAddrs is the replica set, the leader first; nil when the
// coordinator is not replicated. s.mu is held.
func (s *Server) replicaAddrs() []string {
	if s.repl == nil {
		return nil
	}
	self := s.repl.ID()
	addrs := []string{self}
	for _, p := range s.rs.peers {
		if p != self {
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
	err := s.mayAddReplica(ctx, req) // replicakeys.go
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("add replica refused", "node_id", req.GetNodeId(), "addr", req.GetAddr(), "caller", callerAddr(ctx), "err", status.Convert(err).Message())
		return nil, err
	}
	if err := s.repl.AddVoter(replica.Peer{ID: req.GetAddr(), RaftAddr: req.GetRaftAddr()}); err != nil {
		return nil, err
	}
	if _, err := s.commit(entry{Replica: req.GetAddr(), ReplicaNode: req.GetNodeId()}); err != nil {
		return nil, err
	}
	return &gotrainv1.AddReplicaResponse{}, nil
}

// naturalNodeOrder orders node ids ("node-N") by N: the order they joined.
func naturalNodeOrder(a, b string) int {
	na, errA := strconv.Atoi(strings.TrimPrefix(a, "node-"))
	nb, errB := strconv.Atoi(strings.TrimPrefix(b, "node-"))
	if errA != nil || errB != nil {
		return strings.Compare(a, b)
	}
	return na - nb
}
