package state

import (
	"slices"
	"strings"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// The replica set: standalone, fixed by --peers (the config entry);
// embedded, the first node's replica and those the next nodes host at
// Join's request, a lost one replaced by another node's.

// addPeer adds the replica at addr, hosted by node (embedded; "" when
// standalone), to the set and tells every node.
func (s *State) addPeer(addr, node string) {
	if slices.Contains(s.peers, addr) {
		return
	}
	s.peers = append(s.peers, addr)
	if node != "" {
		s.hostOf[addr] = node
	}
	s.log(LevelInfo, "coordinator replica added", "addr", addr, "replicas", len(s.peers))
	s.tellPeers()
}

// tellPeers sends every node the replica set.
func (s *State) tellPeers() { s.pushAll(Out{Replicas: slices.Clone(s.peers)}) }

// replaceLostReplicas: a replica whose node the job lost is gone with it
// (embedded). It leaves the set, and the first node (in join order) on a
// host without a replica is asked to host one in its place (a HostReplica
// event), so that the set keeps its size and can lose one more. The leader
// also takes the lost one out of Raft's configuration (RemoveVoters).
func (s *State) replaceLostReplicas() {
	if s.m.Finished() {
		return
	}
	var lost []string
	for addr, node := range s.hostOf {
		if !s.m.HasNode(node) {
			lost = append(lost, addr)
		}
	}
	if len(lost) == 0 {
		return
	}
	slices.Sort(lost)
	for _, addr := range lost {
		delete(s.hostOf, addr)
		s.peers = slices.DeleteFunc(s.peers, func(p string) bool { return p == addr })
		s.log(LevelWarn, "coordinator replica lost with its node", "addr", addr, "replicas", len(s.peers))
	}
	s.tellPeers()
	for _, id := range s.Nodes() {
		if len(s.peers)+s.pendingReplicas() >= s.cfg.Want {
			break
		}
		addr := s.m.NodeAddress(id)
		if slices.Contains(s.askedHosts, addr) || s.peerOnHost(addr) {
			continue
		}
		s.asked = append(s.asked, id)
		s.askedHosts = append(s.askedHosts, addr)
		s.push(id, Out{HostReplica: true})
		s.log(LevelInfo, "a node is asked to host a coordinator replica", "node_id", id)
	}
	s.emit(RemoveVoters{})
}

// pendingReplicas counts the nodes asked to host a replica that is not in
// the set (yet).
func (s *State) pendingReplicas() int {
	n := 0
	for _, id := range s.asked {
		if s.AskedToHost(id) {
			n++
		}
	}
	return n
}

// peerOnHost says whether a replica of the set runs at address.
func (s *State) peerOnHost(address string) bool {
	for _, p := range s.peers {
		if h, ok := splitHost(p); ok && h == address {
			return true
		}
	}
	return false
}

// loopbackPeer says whether a replica listens on a loopback address
// (--coordinator-listen 127.0.0.1:P): then the job runs on one host.
func (s *State) loopbackPeer() bool {
	for _, p := range s.peers {
		if h, ok := splitHost(p); ok && IsLoopback(h) {
			return true
		}
	}
	return false
}

// besideLoopbackPeer says whether a node of hostname runs on the host of a
// replica that listens on loopback: one reached from its own host alone, so
// a replica beside it would fail with it (and its agent would try the first
// replica's own address). Hostnames tell the host apart where addresses
// cannot: every node of that host may join from a loopback address.
func (s *State) besideLoopbackPeer(hostname string) bool {
	if !s.loopbackPeer() {
		return false
	}
	first, ok := s.hostOf[s.peers[0]]
	return !ok || s.m.NodeHostname(first) == hostname
}

// IsLoopback says whether host (a name or an address, no port) is this
// host's loopback: localhost, 127.0.0.0/8 or ::1.
func IsLoopback(host string) bool {
	return host == "localhost" || host == "::1" || strings.HasPrefix(host, "127.")
}

// splitHost is the host of HOST:PORT or [HOST]:PORT.
func splitHost(addr string) (string, bool) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", false
	}
	h := addr[:i]
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return h, true
}

// askReplica says whether node id, at address, joining now, is to host a
// replica (embedded: the first nodes to join on a host without one, until
// Want; the first node's own agent joins first, where the first replica
// runs).
func (s *State) askReplica(id, address, hostname string) bool {
	want := s.cfg.Want
	if want > 1 && len(s.hostOf) == 0 && len(s.peers) == 1 && (s.peerOnHost(address) || s.loopbackPeer()) {
		s.hostOf[s.peers[0]] = id // the first node: its agent joins its own coordinator first
	}
	if len(s.asked)+1 >= want || slices.Contains(s.askedHosts, address) || s.peerOnHost(address) || s.besideLoopbackPeer(hostname) {
		return false
	}
	s.asked = append(s.asked, id)
	s.askedHosts = append(s.askedHosts, address)
	return true
}

// sayOneHostReplicas says, as the job's first generation starts, that the
// replica set cannot reach its size because the job's nodes (and
// replicas) run on fewer hosts than that: replicas are only asked of nodes
// on hosts without one, since replicas on one host would fail together. A
// loopback replica is said by the agent that runs it (launcher).
func (s *State) sayOneHostReplicas(nodes []job.NodeAssignment) {
	if s.cfg.Want <= 1 || s.loopbackPeer() {
		return
	}
	hosts := map[string]bool{}
	for _, p := range s.peers {
		if h, ok := splitHost(p); ok {
			hosts[h] = true
		}
	}
	for _, n := range nodes {
		hosts[s.m.NodeAddress(n.NodeID)] = true
	}
	if len(hosts) >= s.cfg.Want {
		return
	}
	s.log(LevelWarn, "the coordinator has fewer replicas than asked: the job runs on fewer hosts than replicas, and replicas on one host would fail together (run the nodes on more hosts, or set --coordinator-replicas)",
		"replicas_asked", s.cfg.Want, "hosts", len(hosts))
}
