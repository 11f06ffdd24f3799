package coordinator

import (
	"context"
	"errors"
	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Leadership of a replicated coordinator (replicated.go): only the leader
// serves calls; the others name it, and a new leader takes over from the
// log.

// leaderGrace is how long a new leader waits for the agents to open their
// watch streams before it counts the missing ones as out of contact (and
// probes them: a node whose agent died with the old leader is lost then).
const leaderGrace = time.Second

// leadership: this replica became the leader, or stopped being it.
func (s *Server) leadership(leading bool, rc ReplicaConfig) {
	if !leading {
		s.mu.Lock()
		s.rs.newTerm(false) // ends streams, barriers and long polls: their callers go to the new leader
		s.mu.Unlock()
		return
	}
	// Act only on the whole state: every entry committed before this
	// leadership must be applied here first.
	if err := s.repl.Barrier(); err != nil {
		s.log.Warn("coordinator replica: became the leader but could not catch up", "err", err)
		return
	}
	s.mu.Lock()
	configured := s.st.Configured()
	// Admission's bounds go into the log with the job: every replica
	// admits by the leader's, never by its own flags.
	c := state.Config{Job: s.cfg.Job, Peers: slices.Clone(rc.Peers), Want: rc.Want, NprocPerNode: MaxNprocPerNode, RanksPerJob: MaxRanksPerJob}
	s.mu.Unlock()
	if len(c.Peers) == 0 {
		c.Peers = []string{s.repl.ID()}
	}
	if !configured {
		if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Config{Config: logentry.ConfigToProto(c)}}); err != nil {
			s.log.Warn("coordinator replica: could not record the job's configuration", "err", err)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.repl.Leading() {
		return
	}
	s.rs.newTerm(true)
	s.aq.led(s.now()) // agentquorum.go
	term := s.rs.term
	s.log.Info("coordinator replica leads", "replica", s.repl.ID(), "nodes", len(s.st.Nodes()))
	for _, id := range s.st.Nodes() {
		// Start from what the log says; the streams open here anew.
		o := s.streams.of(s.st, id)
		o.unreachable = s.st.Machine().Unreachable(id) || !s.st.Machine().Attached(id)
		if o.gossipDown {
			s.reachability(id, o, "gossip: no answer (declared dead by the other nodes)")
		}
	}
	// The nodes that have not opened a watch stream at this new leader
	// after its grace are out of contact, and their agents are probed.
	s.bg.after(leaderGrace, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.rs.term != term || !s.rs.leading || s.stop.Err() != nil || s.st.Machine().Finished() {
			return
		}
		for _, id := range s.st.Nodes() {
			if o := s.streams.of(s.st, id); !o.attached {
				why := "no watch stream since this coordinator replica became the leader"
				s.reachability(id, o, why)
				s.bg.do(func() { s.probe(id, why) })
			}
		}
	})
	if d, ok := s.st.Machine().Deadline(); ok {
		s.tickOnDeadline(d)
	}
	s.bg.do(s.reconcileVoters)
}

// notLeader is the error of a call this replica cannot serve: it does not
// lead (now, or any more).
func (s *Server) notLeader(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	leader := s.repl.Leader()
	if leader == s.repl.ID() {
		leader = "" // leading in Raft, not yet here (catching up): try again
	}
	if silent := time.Since(s.repl.LastContact()); leader == "" && silent > noMajorityAfter {
		return status.Errorf(codes.Unavailable, "coordinator replica %s has had no leader for %s: no majority of the replica set %v answers, "+
			"so the job cannot go on (bring back the lost replicas' hosts, or restart the job)", s.repl.ID(), silent.Round(100*time.Millisecond), s.st.Peers())
	}
	return leaderconn.NotLeader(ctx, s.repl.ID(), leader, s.keys.hint(leader, s.repl.Term(), s.log)...) // replicakeys.go
}

// noMajorityAfter: a replica without a leader for this long says there is
// no majority (an election takes well under a second).
const noMajorityAfter = 3 * time.Second

// serves says whether this replica serves method now: it is not
// replicated, or it leads, or any replica serves the call (then, or after
// the job's end).
func (s *Server) serves(method string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.repl == nil || s.rs.leading && s.st.Configured() || s.st.Machine().Finished() && afterTheEnd[method] || anyReplica[method]
}

// leaderUnary refuses calls on a replica that does not lead, naming the
// leader; a call whose leadership ended on the way gets the same answer.
func (s *Server) leaderUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if s.repl == nil {
		return h(ctx, req)
	}
	if !s.serves(info.FullMethod) {
		return nil, s.notLeader(ctx)
	}
	resp, err := h(ctx, req)
	var nl *replica.ErrNotLeader
	if errors.As(err, &nl) {
		return nil, s.notLeader(ctx)
	}
	return resp, err
}

// leaderStream is leaderUnary for streams.
func (s *Server) leaderStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if s.repl == nil {
		return h(srv, ss)
	}
	if !s.serves(info.FullMethod) {
		return s.notLeader(ss.Context())
	}
	return h(srv, ss)
}

// anyReplica are the calls every replica serves, leading or not.
var anyReplica = map[string]bool{gotrainv1.Coordinator_ReplicaCA_FullMethodName: true}

// afterTheEnd are the calls any replica serves once the job finished (its
// state is final everywhere): the agents' last words and reads. Replicas
// wind down as their nodes' agents exit, and a majority may be gone
// before the last agent heard the end.
var afterTheEnd = map[string]bool{
	gotrainv1.Coordinator_WatchGenerations_FullMethodName: true,
	gotrainv1.Coordinator_GetJobStatus_FullMethodName:     true,
	gotrainv1.Coordinator_Diagnose_FullMethodName:         true,
	gotrainv1.Coordinator_ReportProgress_FullMethodName:   true,
	gotrainv1.Coordinator_ReportWorkerExit_FullMethodName: true,
	gotrainv1.Coordinator_ReportEvidence_FullMethodName:   true,
}
