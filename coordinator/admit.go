package coordinator

import (
	"crypto/subtle"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Admission: what a Join is, and whether it is taken, is decided before
// it reaches the replicated log, against the replicated state, by the same
// code every replica runs again when it applies the entry (which may find
// the state changed since, and refuse: deterministically, from the log
// alone). A refused request leaves nothing in the log nor in the snapshot
// (replicated.go): 40 refused Joins of 3 MiB each used to leave 300 MiB in
// every replica.

// hostJoin says whether req is the join of the agent that runs this
// coordinator: it gives the coordinator's host key (Config.HostKey), which
// only that agent holds (in memory). A wrong key is refused: it is someone
// posing as that agent.
func (s *Server) hostJoin(req *gotrainv1.JoinRequest) (bool, error) {
	k := req.GetHostKey()
	if len(k) == 0 {
		return false, nil
	}
	if len(s.cfg.HostKey) == 0 || subtle.ConstantTimeCompare(k, s.cfg.HostKey) != 1 {
		return false, status.Errorf(codes.PermissionDenied, "join from %q: its host key is not this coordinator's: only the agent that runs the coordinator gives one",
			truncate(req.GetNode().GetHostname(), 64))
	}
	return true, nil
}

// loggedJoin is req as the log holds it: without its CSR (only the leader
// issues the certificate, after the join is committed), its host key (the
// entry's Host says what it proved) and fields this coordinator does not
// know (nothing it does not read is kept).
func loggedJoin(req *gotrainv1.JoinRequest) ([]byte, error) {
	logged := proto.CloneOf(req)
	logged.Csr, logged.HostKey = nil, nil
	b, err := proto.Marshal(logged)
	if err == nil {
		clean := &gotrainv1.JoinRequest{}
		if err = (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, clean); err == nil {
			b, err = proto.Marshal(clean)
		}
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "join: %v", err)
	}
	return b, nil
}

// admitJoin checks req (host: its agent runs the coordinator) against the
// job as it stands: the bounds (limits.go), the settings (settings.go) and
// the machine's own checks. It returns the event that joins it and the
// settings' warnings, or why it is refused (logged). It changes nothing.
// s.mu is held.
func (s *Server) admitJoin(req *gotrainv1.JoinRequest, host bool) (job.NodeJoined, []string, error) {
	if err := s.checkJoin(req); err != nil { // limits.go
		s.log.Warn("join rejected", "err", err)
		return job.NodeJoined{}, nil, err
	}
	info := nodeInfoFromProto(req.GetNode())
	warnings, err := checkSettings(s.m.Config(), req.GetSettings()) // settings.go
	if err != nil {
		s.log.Warn("join rejected", "hostname", info.Hostname, "err", err)
		return job.NodeJoined{}, nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	ev := job.NodeJoined{NodeID: fmt.Sprintf("node-%d", s.nodeSeq+1), Info: info, Host: host, NodeRank: -1}
	if r := req.GetNode().NodeRank; r != nil {
		ev.NodeRank = max(int(*r), -1)
	}
	if err := s.m.Admit(ev); err != nil {
		s.log.Warn("join rejected", "hostname", info.Hostname, "err", err)
		return job.NodeJoined{}, nil, grpcError(err)
	}
	return ev, warnings, nil
}
