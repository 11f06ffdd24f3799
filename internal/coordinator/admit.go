package coordinator

import (
	"crypto/subtle"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Admission: whether a Join is taken is one decision of the replicated
// state (state.State.Admit), made before the request reaches the log and
// again as every replica applies it. Here: what the log holds of a Join.
// A refused request leaves nothing in the log nor in the snapshot: 40
// refused Joins of 3 MiB each used to leave 300 MiB in every replica.

// hostJoin says whether req is the join of the agent that runs this
// coordinator: it gives the coordinator's host key (Config.HostKey, here
// key), which only that agent holds (in memory). A wrong key is refused:
// it is someone posing as that agent.
func hostJoin(key []byte, req *gotrainv1.JoinRequest) (bool, error) {
	k := req.GetHostKey()
	if len(k) == 0 {
		return false, nil
	}
	if len(key) == 0 || subtle.ConstantTimeCompare(k, key) != 1 {
		return false, status.Errorf(codes.PermissionDenied, "join from %q: its host key is not this coordinator's: only the agent that runs the coordinator gives one",
			truncate(req.GetNode().GetHostname(), 64))
	}
	return true, nil
}

// loggedJoin is req as the log holds it: without its CSR (only the leader
// issues the certificate, after the join is committed), its host key (the
// entry's Host says what it proved) and fields this coordinator does not
// know (nothing it does not read is kept).
func loggedJoin(req *gotrainv1.JoinRequest) (*gotrainv1.JoinRequest, error) {
	logged := proto.CloneOf(req)
	logged.Csr, logged.HostKey = nil, nil
	b, err := proto.Marshal(logged)
	if err == nil {
		clean := &gotrainv1.JoinRequest{}
		err = (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, clean)
		logged = clean
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "join: %v", err)
	}
	return logged, nil
}
