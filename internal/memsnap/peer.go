package memsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Peer replicas: an agent sends each of its ranks' newest snapshots to its
// ring neighbour's agent (SnapshotPeer.Replicate), and a restarted rank's
// agent that holds none asks the others (Have, Fetch). The receiver writes
// a replica into a memfd of its own and keeps it only once every byte came
// and its length and checksum match: a stream cut halfway leaves the
// previous replica in place (double buffering on the receiver).

// ChunkSize is the size of a replica's chunks on the wire.
const ChunkSize = 1 << 20

// Flow-control windows of the peer connections: gRPC's default 64 KiB
// window caps a stream of megabyte chunks far below the link's rate
// (a window per round trip); 16 MiB keeps a loopback or datacentre link
// busy.
const peerWindow = 16 << 20

// PeerServerOptions are the gRPC server options of a SnapshotPeer server
// (besides its credentials); PeerDialOptions a client's.
func PeerServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(2 * ChunkSize), grpc.InitialWindowSize(peerWindow), grpc.InitialConnWindowSize(peerWindow)}
}

// PeerDialOptions are a SnapshotPeer client's gRPC dial options (besides
// its credentials).
func PeerDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(2 * ChunkSize)), grpc.WithInitialWindowSize(peerWindow), grpc.WithInitialConnWindowSize(peerWindow)}
}

// PeerServer serves a store's replicas to the job's other agents. The
// gRPC server it is registered on must authenticate them (the launcher:
// mutual TLS with node certificates and the proof of the job token); each
// call checks that its connection proved the token, then asks Access
// whether the caller's node may make it.
type PeerServer struct {
	gotrainv1.UnimplementedSnapshotPeerServer
	Store *Store
	// Access decides which node may send or read which rank's replicas
	// (internal/launcher/snaptier: the nodes of the current generation, each for its
	// own ranks); nil lets every node the connection proved (benchmarks).
	Access PeerAccess
	Log    *slog.Logger
}

// PeerAccess decides which calls a peer node may make. Its errors wrap
// ErrPeerRefused when the node may not (PERMISSION_DENIED); any other error
// is a passing one (UNAVAILABLE: ask again).
type PeerAccess interface {
	// MayReplicate: node, in generation gen, sends a replica of rank.
	MayReplicate(ctx context.Context, node string, gen int64, rank int) error
	// MayFetch: node, in generation gen, asks for the replica of rank.
	MayFetch(ctx context.Context, node string, gen int64, rank int) error
}

// ErrPeerRefused: the peer node may not make this call.
var ErrPeerRefused = errors.New("memsnap: refused")

var _ gotrainv1.SnapshotPeerServer = (*PeerServer)(nil)

func (p *PeerServer) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

func proven(ctx context.Context) error {
	if _, ok := jobtls.ProvenPeer(ctx); !ok {
		return status.Error(codes.Unauthenticated, "memsnap: the connection did not prove the job token")
	}
	return nil
}

// CallerNode is the node id of the certificate of ctx's connection, which
// the peer port's TLS (jobtls.NodePeerTLS) verified against the job CA; ""
// when the connection proved none.
func CallerNode(ctx context.Context) string {
	st, ok := jobtls.ProvenPeer(ctx)
	if !ok {
		return ""
	}
	return jobtls.PeerNode(st)
}

// allowed asks Access whether the caller of ctx may make a call (may is
// MayReplicate or MayFetch), as a gRPC status.
func (p *PeerServer) allowed(ctx context.Context, call string, gen int64, rank int) error {
	if err := proven(ctx); err != nil {
		return err
	}
	if p.Access == nil {
		return nil
	}
	node := CallerNode(ctx)
	may := p.Access.MayFetch
	if call == "Replicate" {
		may = p.Access.MayReplicate
	}
	err := may(ctx, node, gen, rank)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrPeerRefused):
		p.log().Warn("a peer node's call refused", "call", call, "node", node, "generation", gen, "rank", rank, "err", err)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// Replicate receives one replica and keeps it once it is complete.
func (p *PeerServer) Replicate(stream gotrainv1.SnapshotPeer_ReplicateServer) error {
	if err := proven(stream.Context()); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "memsnap: a replica without its facts: %v", err)
	}
	rank, step, size := int(first.GetRank()), first.GetStep(), first.GetSize()
	if err := p.allowed(stream.Context(), "Replicate", first.GetGeneration(), rank); err != nil {
		return err
	}
	if size < 0 {
		return status.Errorf(codes.InvalidArgument, "memsnap: rank %d's replica claims %d bytes", rank, size)
	}
	// Checked before the bytes travel, and again once they came (the key
	// may be set meanwhile): a replica without a valid MAC is not this
	// job's agents'.
	if err := p.Store.CheckMAC(rank, step, size, first.GetCrc(), first.GetSum(), first.GetMac()); err != nil {
		p.log().Warn("a peer's replica refused: its MAC does not match", "rank", rank, "step", step, "from", CallerNode(stream.Context()), "err", err)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	rc, err := p.Store.Receive(rank, step, size)
	if err != nil {
		p.log().Warn("a peer's replica refused", "rank", rank, "step", step, "from", CallerNode(stream.Context()), "err", err)
		if errors.Is(err, ErrBusy) {
			return status.Error(codes.Aborted, err.Error())
		}
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	defer rc.Done()
	fd, buf, err := replicaMemory(rank, size)
	if err != nil {
		return status.Errorf(codes.Internal, "memsnap: memory for rank %d's replica: %v", rank, err)
	}
	n, err := receive(buf, first.GetData(), stream.Recv, rc.Grow)
	unmap(buf) // the writable mapping goes before the seal
	if err == nil && n != size {
		err = fmt.Errorf("%d of its %d bytes came", n, size)
	}
	if errors.Is(err, ErrTooLarge) {
		closeFd(fd)
		p.log().Warn("a peer's replica cut off: it does not fit in --snapshot-memory", "rank", rank, "step", step, "from", CallerNode(stream.Context()), "err", err)
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	if err != nil {
		closeFd(fd)
		return status.Errorf(codes.DataLoss, "memsnap: rank %d's replica of step %d from %s is incomplete (the previous one is kept): %v", rank, step, first.GetNodeId(), err)
	}
	if _, err := p.Store.CommitReplica(rank, step, fd, size, first.GetCrc(), first.GetSum(), first.GetMac()); err != nil {
		code := codes.DataLoss
		switch {
		case errors.Is(err, ErrTooLarge):
			code = codes.ResourceExhausted
		case errors.Is(err, ErrMAC):
			code = codes.PermissionDenied
		}
		return status.Error(code, err.Error())
	}
	return stream.SendAndClose(&gotrainv1.ReplicateResponse{})
}

// receive copies the chunks, the first one's data first, into buf and
// returns how many bytes came; more than buf holds is an error, and so is
// grow's (when not nil), which counts each chunk before it is copied.
func receive(buf, data []byte, next func() (*gotrainv1.SnapshotChunk, error), grow func(int) error) (int64, error) {
	var n int64
	for {
		if int64(len(data)) > int64(len(buf))-n {
			return n, fmt.Errorf("more than the %d bytes it claims", len(buf))
		}
		if grow != nil {
			if err := grow(len(data)); err != nil {
				return n, err
			}
		}
		n += int64(copy(buf[n:], data))
		c, err := next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		data = c.GetData()
	}
}

// Have says which replica of a rank the store holds.
func (p *PeerServer) Have(ctx context.Context, req *gotrainv1.PeerSnapshotRequest) (*gotrainv1.PeerSnapshotInfo, error) {
	if err := p.allowed(ctx, "Have", req.GetGeneration(), int(req.GetRank())); err != nil {
		return nil, err
	}
	s, ok := p.Store.AcquireReplica(int(req.GetRank()))
	if !ok {
		return &gotrainv1.PeerSnapshotInfo{}, nil
	}
	defer p.Store.Release(s)
	return &gotrainv1.PeerSnapshotInfo{Found: true, Step: s.Step, Size: s.Size}, nil
}

// Fetch streams the replica of a rank.
func (p *PeerServer) Fetch(req *gotrainv1.PeerSnapshotRequest, stream gotrainv1.SnapshotPeer_FetchServer) error {
	if err := p.allowed(stream.Context(), "Fetch", req.GetGeneration(), int(req.GetRank())); err != nil {
		return err
	}
	s, ok := p.Store.AcquireReplica(int(req.GetRank()))
	if !ok {
		return status.Errorf(codes.NotFound, "memsnap: no replica of rank %d here", req.GetRank())
	}
	defer p.Store.Release(s)
	if req.GetLength() == 0 {
		return sendChunks(s, s.Bytes(), "", 0, stream.Send)
	}
	off, n := req.GetOffset(), req.GetLength()
	switch {
	case req.GetStep() != s.Step:
		return status.Errorf(codes.FailedPrecondition, "memsnap: the replica of rank %d here is of step %d, not %d", req.GetRank(), s.Step, req.GetStep())
	case off < 0 || n < 0 || off > s.Size || n > s.Size-off:
		return status.Errorf(codes.OutOfRange, "memsnap: bytes [%d, %d) of rank %d's replica of %d bytes", off, off+n, req.GetRank(), s.Size)
	}
	return sendChunks(s, s.Bytes()[off:off+n], "", 0, stream.Send)
}

// sendChunks sends data, s's bytes or a range of them: s's facts and MAC
// with the first chunk.
func sendChunks(s *Snapshot, data []byte, nodeID string, gen int64, send func(*gotrainv1.SnapshotChunk) error) error {
	first := true
	for first || len(data) > 0 {
		n := min(len(data), ChunkSize)
		c := &gotrainv1.SnapshotChunk{Data: data[:n]}
		if first {
			c.Rank, c.Step, c.Size, c.Crc, c.Sum, c.NodeId = int32(s.Rank), s.Step, s.Size, s.CRC, s.Sum, nodeID
			c.Mac, c.Generation = s.MAC, gen
			first = false
		}
		if err := send(c); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// Replicate sends s, a snapshot of this node's store, to the peer agent
// behind c as from node nodeID in generation gen, and returns once the
// peer kept it or said why not.
func Replicate(ctx context.Context, c gotrainv1.SnapshotPeerClient, s *Snapshot, nodeID string, gen int64) error {
	stream, err := c.Replicate(ctx)
	if err != nil {
		return err
	}
	if err := sendChunks(s, s.Bytes(), nodeID, gen, stream.Send); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	// On io.EOF the server ended the stream early: CloseAndRecv has its status.
	_, err = stream.CloseAndRecv()
	return err
}

// Fetched is a replica a peer sent: a sealed memfd and its facts, its
// length and checksum checked; its MAC is the peer's word, for the
// receiver to check (Store.CheckFetched).
type Fetched struct {
	Fd   int
	Step int64
	Size int64
	CRC  uint32
	Sum  string
	MAC  []byte
}

// FetchReplica asks the peer agent behind c for its replica of rank, as
// a node of generation gen, and returns it in a sealed memfd, its length
// and checksum checked; found is false when the peer holds none.
func FetchReplica(ctx context.Context, c gotrainv1.SnapshotPeerClient, rank int, gen int64) (f Fetched, found bool, err error) {
	stream, err := c.Fetch(ctx, &gotrainv1.PeerSnapshotRequest{Rank: int32(rank), Generation: gen})
	if err != nil {
		return Fetched{}, false, err
	}
	first, err := stream.Recv()
	if status.Code(err) == codes.NotFound {
		return Fetched{}, false, nil
	}
	if err != nil {
		return Fetched{}, false, err
	}
	size := first.GetSize()
	if size < 0 {
		return Fetched{}, false, fmt.Errorf("%w: rank %d's replica claims %d bytes", ErrTorn, rank, size)
	}
	fd, buf, err := replicaMemory(rank, size)
	if err != nil {
		return Fetched{}, false, err
	}
	n, err := receive(buf, first.GetData(), stream.Recv, nil)
	unmap(buf)
	if err == nil && n != size {
		err = fmt.Errorf("%d of its %d bytes came", n, size)
	}
	if err != nil {
		closeFd(fd)
		return Fetched{}, false, fmt.Errorf("%w: rank %d's replica of step %d: %v", ErrTorn, rank, first.GetStep(), err)
	}
	return sealFetched(rank, first.GetStep(), fd, size, first.GetCrc(), first.GetSum(), first.GetMac())
}

// replicaMemory is a new memfd of size bytes for rank's replica and its
// writable mapping, to receive the bytes into (unmapped before the seal).
func replicaMemory(rank int, size int64) (int, []byte, error) {
	fd, err := createMemfd(fmt.Sprintf("gotrain-replica-%d", rank), size)
	if err != nil {
		return -1, nil, err
	}
	buf, err := mapWritable(fd, size)
	if err != nil {
		closeFd(fd)
		return -1, nil, err
	}
	return fd, buf, nil
}

// sealFetched seals and checks fd, a replica received whole, as a worker's
// snapshot is; Fetched owns fd from then on (closed on an error).
func sealFetched(rank int, step int64, fd int, size int64, crc uint32, sum string, mac []byte) (Fetched, bool, error) {
	s, err := openChecked(rank, step, fd, size, crc, sum, SourcePeer, true)
	if err != nil {
		return Fetched{}, false, err
	}
	unmap(s.data)
	return Fetched{Fd: s.fd, Step: s.Step, Size: s.Size, CRC: s.CRC, Sum: s.Sum, MAC: mac}, true, nil
}

// fetchRangeFrom is the size from which FetchReplicaOver splits a replica
// into ranges, one per connection: one TLS stream runs at one core's pace
// (0.7 GB/s on the GPU machine's host, bench/results/memstate-restore-2026-12-04.md).
const fetchRangeFrom = 64 << 20

// FetchReplicaOver is FetchReplica over several connections to the same
// peer agent: once that agent said it holds a replica of rank of step and
// size bytes (Have), each client fetches one range of it into the same
// memfd at once; the whole is then sealed and checked as FetchReplica's.
// With one client, or a small replica, it is FetchReplica.
func FetchReplicaOver(ctx context.Context, cs []gotrainv1.SnapshotPeerClient, rank int, gen, step, size int64) (Fetched, bool, error) {
	if len(cs) < 2 || size < fetchRangeFrom {
		return FetchReplica(ctx, cs[0], rank, gen)
	}
	fd, buf, err := replicaMemory(rank, size)
	if err != nil {
		return Fetched{}, false, err
	}
	part := (size + int64(len(cs)) - 1) / int64(len(cs))
	facts := make([]*gotrainv1.SnapshotChunk, len(cs))
	g, gctx := errgroup.WithContext(ctx)
	for i, c := range cs {
		off := int64(i) * part
		n := min(part, size-off)
		if n <= 0 {
			continue
		}
		g.Go(func() error {
			stream, err := c.Fetch(gctx, &gotrainv1.PeerSnapshotRequest{Rank: int32(rank), Generation: gen, Step: step, Offset: off, Length: n})
			if err != nil {
				return err
			}
			first, err := stream.Recv()
			if err != nil {
				return err
			}
			facts[i] = first
			got, err := receive(buf[off:off+n], first.GetData(), stream.Recv, nil)
			if err == nil && got != n {
				err = fmt.Errorf("%d of bytes [%d, %d) came", got, off, off+n)
			}
			return err
		})
	}
	err = g.Wait()
	unmap(buf)
	if status.Code(err) == codes.NotFound || status.Code(err) == codes.FailedPrecondition {
		closeFd(fd)
		return Fetched{}, false, nil // replaced or dropped since Have: ask again
	}
	if err != nil {
		closeFd(fd)
		return Fetched{}, false, fmt.Errorf("%w: rank %d's replica of step %d: %v", ErrTorn, rank, step, err)
	}
	var crc uint32
	var sum string
	var mac []byte
	for _, f := range facts {
		if f == nil {
			continue
		}
		if f.GetStep() != step || f.GetSize() != size || (mac != nil && (f.GetCrc() != crc || f.GetSum() != sum || !bytes.Equal(f.GetMac(), mac))) {
			closeFd(fd)
			return Fetched{}, false, fmt.Errorf("%w: rank %d's replica: a range of step %d and %d bytes, want step %d and %d bytes, with the facts of the other ranges", ErrTorn, rank, f.GetStep(), f.GetSize(), step, size)
		}
		crc, sum, mac = f.GetCrc(), f.GetSum(), f.GetMac()
		if mac == nil {
			mac = []byte{}
		}
	}
	return sealFetched(rank, step, fd, size, crc, sum, mac)
}
