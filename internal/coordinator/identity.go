package coordinator

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/state"
	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Node identity. With a job CA (Config.CA), Join issues
// each node a client certificate naming its node id, and the node presents
// it on every later call. A node may then act only for itself, as
// Kubernetes' NodeRestriction lets a kubelet act only for its own node:
//
//   - WatchGenerations, ReportProgress, ReportWorkerExit (and parked
//     reports), ReportEvidence: only with the certificate's node id (the
//     job machine checks the ranks against the node).
//   - Barrier: only for a rank that runs on the caller's node in the
//     current generation.
//   - KVPut: only by a node; a communicator's rendezvous keys only by the
//     node of the rank that publishes them (ncclcomm's id: rank 0;
//     cpucomm's address of rank R: rank R), in the current generation;
//     the snapshot tier's address keys "gotrain/memsnap/g<gen>/n<group
//     rank>" only by the node of that group rank in that generation, the
//     current one (else a node could publish its address for another's
//     and receive its replicas). Other keys: any node of the job.
//   - KVGet: only by a node.
//   - AddReplica: only with the certificate's node id, and only a node
//     asked to host a replica (replicakeys.go); ReplicaCA likewise
//     (embedded), checked by its handler (a standalone peer has no node
//     certificate).
//   - Join, GetJobStatus, Diagnose: the job token alone (a joining node has
//     no certificate yet; gotrain diagnose and top have none).
//
// Without a CA (tests that serve plaintext) nothing is checked here.

// nodeCalls need a node certificate; the others take the token alone.
var nodeCalls = map[string]bool{
	gotrainv1.Coordinator_WatchGenerations_FullMethodName: true,
	gotrainv1.Coordinator_KVPut_FullMethodName:            true,
	gotrainv1.Coordinator_KVGet_FullMethodName:            true,
	gotrainv1.Coordinator_Barrier_FullMethodName:          true,
	gotrainv1.Coordinator_ReportProgress_FullMethodName:   true,
	gotrainv1.Coordinator_ReportWorkerExit_FullMethodName: true,
	gotrainv1.Coordinator_ReportEvidence_FullMethodName:   true,
	gotrainv1.Coordinator_AddReplica_FullMethodName:       true,
}

// callerNode is the node id of the caller's verified certificate, "" when
// it presented none.
func callerNode(ctx context.Context) string {
	st, ok := jobtls.ProvenPeer(ctx)
	if !ok || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return ""
	}
	return jobtls.NodeID(st.VerifiedChains[0][0])
}

// identity checks who acts for which node (see above); the server
// installs it with a job CA.
type identity struct {
	log *slog.Logger
	// ranks is where rank runs in generation gen (owner, ok) and the
	// current generation, from the replicated state.
	ranks func(gen int64, rank int) (owner string, ok bool, cur int64)
	// groups is the node of group rank gr in generation gen (owner, ok)
	// and the current generation, from the replicated state.
	groups func(gen int64, gr int) (owner string, ok bool, cur int64)
}

// unary checks a unary call's identity.
func (i identity) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !nodeCalls[info.FullMethod] {
		return h(ctx, req)
	}
	node := callerNode(ctx)
	if node == "" {
		return nil, errNoNodeCert(info.FullMethod)
	}
	if err := i.mayAct(node, req); err != nil {
		i.log.Warn("call refused: a node acted for another", "method", info.FullMethod, "caller", node, "err", status.Convert(err).Message())
		return nil, err
	}
	return h(ctx, req)
}

// stream checks WatchGenerations' request once it is received.
func (i identity) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !nodeCalls[info.FullMethod] {
		return h(srv, ss)
	}
	node := callerNode(ss.Context())
	if node == "" {
		return errNoNodeCert(info.FullMethod)
	}
	return h(srv, &checkedStream{ServerStream: ss, check: func(m any) error { return i.mayAct(node, m) }})
}

type checkedStream struct {
	grpc.ServerStream
	check func(any) error
}

func (c *checkedStream) RecvMsg(m any) error {
	if err := c.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return c.check(m)
}

func errNoNodeCert(method string) error {
	return status.Errorf(codes.PermissionDenied, "%s needs the node certificate its agent got at Join: only a node's agent may call it (gotrain launch does; update an older agent)", method)
}

// mayAct says whether node may send req.
func (i identity) mayAct(node string, req any) error {
	self := func(id string) error {
		if id != node {
			return status.Errorf(codes.PermissionDenied, "this connection's certificate is node %q's, but the request is for node %q: a node may act only for itself", node, id)
		}
		return nil
	}
	switch r := req.(type) {
	case *gotrainv1.WatchGenerationsRequest:
		return self(r.GetNodeId())
	case *gotrainv1.ReportProgressRequest:
		return self(r.GetNodeId())
	case *gotrainv1.ReportWorkerExitRequest:
		return self(r.GetNodeId())
	case *gotrainv1.ReportEvidenceRequest:
		return self(r.GetNodeId())
	case *gotrainv1.AddReplicaRequest:
		return self(r.GetNodeId())
	case *gotrainv1.BarrierRequest:
		return i.ownsRank(node, r.GetGeneration(), int(r.GetRank()), "barrier "+strconv.Quote(r.GetName()))
	case *gotrainv1.KVPutRequest:
		if gen, rank, ok := keyOwner(r.GetKey()); ok {
			return i.ownsRank(node, gen, rank, "key "+strconv.Quote(r.GetKey()))
		}
		if strings.HasPrefix(r.GetKey(), memsnapKeyPrefix) {
			return i.isGroupRank(node, r.GetKey())
		}
		if strings.HasPrefix(r.GetKey(), gangKeyPrefix) {
			return i.gangKey(node, r.GetKey())
		}
	}
	return nil
}

// ownsRank says whether rank runs on node in generation gen. A generation
// other than the current one is left to the handler (a barrier of an
// ended generation fails there with its reason) except for keys: no node
// may publish a communicator's key for a generation that is not running.
func (i identity) ownsRank(node string, gen int64, rank int, what string) error {
	owner, ok, cur := i.ranks(gen, rank)
	switch {
	case ok && owner == node:
		return nil
	case ok:
		return status.Errorf(codes.PermissionDenied, "%s: rank %d runs on node %q in generation %d, not on this connection's node %q: a node may act only for its own ranks", what, rank, owner, gen, node)
	case strings.HasPrefix(what, "barrier") && gen != cur:
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s: rank %d of generation %d does not run on node %q (the current generation is %d)", what, rank, gen, node, cur)
}

// memsnapKeyPrefix starts the snapshot tier's address keys
// (internal/launcher/snaptier.PeerKey: "gotrain/memsnap/g<gen>/n<group rank>").
const memsnapKeyPrefix = "gotrain/memsnap/"

// isGroupRank says whether node may put key, a snapshot tier's address
// key: only the node of its group rank in its generation, the current one.
func (i identity) isGroupRank(node, key string) error {
	var gen int64
	var gr int
	if n, err := fmt.Sscanf(key, memsnapKeyPrefix+"g%d/n%d", &gen, &gr); err != nil || n != 2 || key != fmt.Sprintf("%sg%d/n%d", memsnapKeyPrefix, gen, gr) {
		return status.Errorf(codes.PermissionDenied, "key %q: under %q only the snapshot tier's address keys (g<generation>/n<group rank>) may be put", key, memsnapKeyPrefix)
	}
	return i.ownsGroupRank(node, key, gen, gr, "a node publishes only its own snapshot-peer address", ": a node publishes its snapshot-peer address only in the generation it runs")
}

// ownsGroupRank says whether node is group rank gr of generation gen, so
// may put key; the refusal ends with why (not the owner) or where (no
// such group rank).
func (i identity) ownsGroupRank(node, key string, gen int64, gr int, why, where string) error {
	owner, ok, cur := i.groups(gen, gr)
	switch {
	case ok && owner == node:
		return nil
	case ok:
		return status.Errorf(codes.PermissionDenied, "key %q: group rank %d of generation %d is node %q, not this connection's node %q: %s", key, gr, gen, owner, node, why)
	}
	return status.Errorf(codes.PermissionDenied, "key %q: no node has group rank %d in generation %d (the current generation is %d)%s", key, gr, gen, cur, where)
}

// keyOwner maps a communicator's rendezvous key to the generation and rank
// that publish it: worker/ncclcomm.IDKey "ncclcomm/NAME/GEN/id" (rank 0)
// and worker/cpucomm.AddrKey "cpucomm/NAME/GEN/addr/RANK". Names may hold
// slashes; the key is read from its end. identity_test.go checks these
// shapes against the worker packages' own functions.
func keyOwner(key string) (gen int64, rank int, ok bool) { return state.CommKey(key) }

// checkCSR checks a Join's certificate request before the node joins, so
// that issuing its certificate cannot fail after. Config.CA is not nil.
func checkCSR(req *gotrainv1.JoinRequest) error {
	if len(req.GetCsr()) == 0 {
		return status.Error(codes.InvalidArgument, "join without a certificate request (JoinRequest.csr): this coordinator gives every node a certificate of its own; update the agent")
	}
	csr, err := x509.ParseCertificateRequest(req.GetCsr())
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "join: certificate request: %v", err)
	}
	return nil
}

// gangKeyPrefix starts the preflight gang check's keys
// (internal/preflight/gangrun.go): "preflight/gang/GEN/...".
const gangKeyPrefix = "preflight/gang/"

// gangKey says whether node may put key, a gang check's: a node's own
// join and receipt (here/I, heard/I: group rank I), the leader's roster and
// verdict (group rank 0, which the coordinator's record trusts), and the
// pair communicators' addresses (gangpairJ: rank 0 the leader's, rank 1
// node J's). The job-wide communicator's addresses are by place in the
// roster, which the connections' token proof guards.
func (i identity) gangKey(node, key string) error {
	gen, gr, err := gangKeyOwner(key)
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "key %q: %v", key, err)
	}
	if gr < 0 {
		return nil
	}
	return i.ownsGroupRank(node, key, gen, gr, "a node puts only its own part of the gang check", "")
}

// gangKeyOwner is the generation and group rank that may put a gang
// check's key (-1: any node of the job), or why no node may.
func gangKeyOwner(key string) (gen int64, gr int, err error) {
	parts := strings.Split(strings.TrimPrefix(key, gangKeyPrefix), "/")
	bad := fmt.Errorf("under %q only the gang check's keys may be put", gangKeyPrefix)
	num := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 0 && strconv.Itoa(n) == s
	}
	g, ok := num(parts[0])
	if !ok || len(parts) < 2 {
		return 0, 0, bad
	}
	gen = int64(g)
	switch rest := parts[1:]; {
	case len(rest) == 1 && (rest[0] == "roster" || rest[0] == "verdict"):
		return gen, 0, nil
	case len(rest) == 2 && (rest[0] == "here" || rest[0] == "heard"):
		if n, ok := num(rest[1]); ok {
			return gen, n, nil
		}
	case len(rest) == 5 && rest[0] == "cpucomm" && rest[2] == parts[0] && rest[3] == "addr":
		r, ok := num(rest[4])
		if !ok {
			return 0, 0, bad
		}
		if rest[1] == "gang" {
			return gen, -1, nil
		}
		if j, ok := num(strings.TrimPrefix(rest[1], "gangpair")); ok && strings.HasPrefix(rest[1], "gangpair") && r <= 1 {
			if r == 0 {
				return gen, 0, nil
			}
			return gen, j, nil
		}
	}
	return 0, 0, bad
}
