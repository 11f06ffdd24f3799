package coordinator

import (
	"context"
	"errors"
	"fmt"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/connguard"
	"github.com/gotrain/gotrain/internal/coordinator/kv"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Bounds on what one caller can make the coordinator hold. A request over them gets a clear error, never the coordinator's
// memory or lock.
const (
	// MaxNprocPerNode bounds the workers one node runs.
	MaxNprocPerNode = 1024
	// MaxRanksPerJob bounds the ranks of all nodes together.
	MaxRanksPerJob = 65536

	// maxEvidencePerReport bounds the evidence entries of one
	// ReportEvidence; maxEvidenceText one entry's text (longer texts are
	// cut, with a note); maxEvidenceBytes all evidence text the job keeps
	// (more is dropped, with a warning).
	maxEvidencePerReport = 64
	maxEvidenceText      = 256 << 10
	maxEvidenceBytes     = 64 << 20
	// maxExitLines and maxExitLine bound a ReportWorkerExit's stderr tail,
	// XID errors and notes.
	maxExitLines = 256
	maxExitLine  = 4 << 10

	// maxRecvMsgSize bounds one request (gRPC's default, made explicit).
	maxRecvMsgSize = 4 << 20
	// handshakeTimeout closes a connection that has not completed its
	// HTTP/2 handshake (a silent TCP connection) within it.
	handshakeTimeout = 5 * time.Second
	// maxHeaderListSize bounds one call's metadata (grpc's default is
	// 16 MiB): the token, a leader hint and trace headers fit many times.
	maxHeaderListSize = 64 << 10
	// maxConnectionIdle closes a connection without a call in flight for
	// it (agents hold a watch stream and are never idle; a CLI reconnects).
	maxConnectionIdle = 15 * time.Second
)

// limits are a Server's bounds; the zero value means the defaults (tests
// set smaller ones before Serve).
type limits struct {
	streamsPerConn uint32
	connIdle       time.Duration
}

func (l *limits) withDefaults() {
	if l.streamsPerConn == 0 {
		// Every local rank may wait in a Barrier or KVGet relayed on its
		// agent's one connection, besides the watch stream and reports.
		l.streamsPerConn = 2*MaxNprocPerNode + 64
	}
	if l.connIdle == 0 {
		l.connIdle = maxConnectionIdle
	}
}

// serverOptions are the gRPC server's on lis: the token check, the bounds
// on connections, streams, headers and messages, keepalive, and the request
// bounds (checkRequest).
func (s *Server) serverOptions(lis net.Listener) []grpc.ServerOption {
	s.mu.Lock()
	s.limits.withDefaults()
	l := s.limits
	s.mu.Unlock()
	opts := token.ServerOptions(s.cfg.Token)
	if g, ok := lis.(*connguard.Listener); ok {
		// Right after the token check: a call found valid moves its
		// connection to the guard's authenticated budget, out of reach of
		// unauthenticated floods and their handshake deadline
		// (internal/coordinator/host/bounds.go).
		opts = append(opts, grpc.ChainUnaryInterceptor(markUnary(g.Guard)), grpc.ChainStreamInterceptor(markStream(g.Guard)))
	}
	if s.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(jobtls.ServerCredentials(s.cfg.TLS, s.cfg.Token))) // the proof of the token, both ways
	}
	// After the token check: a replica that does not lead names the
	// leader (leadership.go); then, with a job CA, who may act for which
	// node (identity.go).
	opts = append(opts, grpc.ChainUnaryInterceptor(s.leaderUnary), grpc.ChainStreamInterceptor(s.leaderStream))
	if s.cfg.CA != nil {
		id := identity{log: s.log, ranks: func(gen int64, rank int) (string, bool, int64) {
			s.mu.Lock()
			defer s.mu.Unlock()
			owner, ok := s.st.Machine().NodeOfRank(gen, rank)
			return owner, ok, s.st.Machine().Generation()
		}, groups: func(gen int64, gr int) (string, bool, int64) {
			s.mu.Lock()
			defer s.mu.Unlock()
			owner, ok := s.st.Machine().NodeOfGroupRank(gen, gr)
			return owner, ok, s.st.Machine().Generation()
		}}
		opts = append(opts, grpc.ChainUnaryInterceptor(id.unary), grpc.ChainStreamInterceptor(id.stream))
	}
	return append(opts,
		grpc.MaxRecvMsgSize(maxRecvMsgSize),
		grpc.MaxConcurrentStreams(l.streamsPerConn),
		grpc.MaxHeaderListSize(maxHeaderListSize),
		grpc.ConnectionTimeout(handshakeTimeout),
		// The server pings a connection silent for keepaliveTime and drops
		// it when no answer comes within keepaliveTimeout, so that a node
		// that vanishes without closing its connection (power loss, a
		// partition) is lost within about 20 s rather than when TCP gives
		// up; it allows the agents' own pings (launcher).
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout, MaxConnectionIdle: l.connIdle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(s.bounds.check),
	)
}

// markAuthenticated marks the connection of a call that passed the token
// check authenticated in g; a call whose connection finds g's
// authenticated budget full fails (its connection is closed).
func markAuthenticated(ctx context.Context, g *connguard.Guard) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	if err := g.MarkAuthenticated(p.LocalAddr, p.Addr); err != nil {
		return status.Errorf(codes.Unavailable, "the coordinator holds its maximum of %d connections: try again later, or raise the bound (internal/coordinator/host/bounds.go)", g.Limits().Authenticated)
	}
	return nil
}

func markUnary(g *connguard.Guard) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := markAuthenticated(ctx, g); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

func markStream(g *connguard.Guard) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := markAuthenticated(ss.Context(), g); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

// requestBounds bounds the text requests carry before their handlers
// keep it; it counts the job's evidence text.
type requestBounds struct {
	log           *slog.Logger
	mu            sync.Mutex
	evidenceBytes int
}

// check bounds req's text: evidence (cut per entry, dropped past the
// job's total) and a worker exit's lines.
func (b *requestBounds) check(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	switch r := req.(type) {
	case *gotrainv1.ReportEvidenceRequest:
		if len(r.GetEvidence()) > maxEvidencePerReport {
			return nil, status.Errorf(codes.InvalidArgument, "report evidence: %d entries, at most %d", len(r.GetEvidence()), maxEvidencePerReport)
		}
		n := 0
		for _, e := range r.GetEvidence() {
			e.Kind = truncate(e.GetKind(), maxExitLine)
			e.Text = truncate(e.GetText(), maxEvidenceText)
			n += len(e.Text) + len(e.Kind)
		}
		b.mu.Lock()
		over := b.evidenceBytes+n > maxEvidenceBytes
		if !over {
			b.evidenceBytes += n
		}
		b.mu.Unlock()
		if over {
			b.log.Warn("evidence dropped: the job holds its maximum of evidence text", "node_id", r.GetNodeId(), "bytes", n, "max", maxEvidenceBytes)
			r.Evidence = nil
		}
	case *gotrainv1.ReportWorkerExitRequest:
		r.StderrTail = truncateLines(r.GetStderrTail())
		r.XidErrors = truncateLines(r.GetXidErrors())
		r.Notes = truncateLines(r.GetNotes())
		r.Signal = truncate(r.GetSignal(), maxExitLine)
	}
	return h(ctx, req)
}

const cut = state.Cut

// truncate cuts s to at most max bytes at a rune boundary, saying so.
func truncate(s string, max int) string { return state.Truncate(s, max) }

// truncateLines keeps the last maxExitLines lines (a tail's newest), each
// cut to maxExitLine.
func truncateLines(lines []string) []string {
	if len(lines) > maxExitLines {
		lines = lines[len(lines)-maxExitLines:]
	}
	for i, l := range lines {
		lines[i] = truncate(l, maxExitLine)
	}
	return lines
}

// kvError is the status of a kv error.
func kvError(err error) error {
	switch {
	case errors.Is(err, kv.ErrConflict):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, kv.ErrTooLarge):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, kv.ErrFull):
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return status.Error(codes.Internal, fmt.Sprintf("kv: %v", err))
}
