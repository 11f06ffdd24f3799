package snaptier

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/memsnap"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Peer replicas of the in-memory snapshot tier: the agent
// serves SnapshotPeer on --node-addr (mutual TLS with the job's node
// certificates and the proof of the job token: only this job's agents get
// in), replicates each snapshot a local worker hands over to its ring
// neighbour (the node of group rank +1 mod the nodes of the current
// generation), and answers a local rank it holds nothing of with the
// newest replica any other node of the generation holds. Agents find one
// another through the coordinator's key-value store: each publishes its
// address under the generation and its group rank (write-once keys).

// peerKey is the key node groupRank of generation gen publishes its
// snapshot-peer address under (value: "node-id address").
func peerKey(gen int64, groupRank int) string {
	return fmt.Sprintf("gotrain/memsnap/g%d/n%d", gen, groupRank)
}

// Bounds of the peer traffic: a replica or fetch that takes longer gives
// up (the own copy is kept; a restore goes on to the disk tier).
const (
	peerLookupWait  = 5 * time.Second
	peerReplicaWait = 30 * time.Second
)

// Peers is the agent's side of the peer replicas.
type Peers struct {
	store  *memsnap.Store
	nodeID string
	coord  gotrainv1.CoordinatorClient
	dial   func(addr, node string) (*grpc.ClientConn, error)
	log    *slog.Logger
	ctx    context.Context // the agent's subsystems': bounds the background work

	mu        sync.Mutex
	gen       int64
	groupRank int
	nodes     int
	addrs     map[int]peerAddr            // of the current generation, by group rank
	conns     map[string]*grpc.ClientConn // by address
	warned    map[string]bool             // one warning per cause
}

type peerAddr struct{ node, addr string }

// NewPeers is the peer side of st for node nodeID: it dials other agents
// with cert (a node certificate of the job CA ca) and the proof of the job
// token tok, and finds them through coord's key-value store. ctx bounds its
// background work (the agent's subsystems').
func NewPeers(ctx context.Context, st *memsnap.Store, nodeID string, coord gotrainv1.CoordinatorClient, ca *x509.Certificate, cert tls.Certificate, tok string, log *slog.Logger) *Peers {
	_, client := jobtls.NodePeerTLS(ca, cert)
	return &Peers{
		ctx: ctx, store: st, nodeID: nodeID, coord: coord, log: log,
		dial: func(addr, node string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, append(memsnap.PeerDialOptions(), grpc.WithTransportCredentials(jobtls.PeerCredentials(client(node), tok)))...)
		},
		conns: map[string]*grpc.ClientConn{}, warned: map[string]bool{},
	}
}

// Server is the SnapshotPeer gRPC server: node certificates of the job CA
// both ways, then the proof of the token.
func (p *Peers) Server(tok string, ca *x509.Certificate, cert tls.Certificate) *grpc.Server {
	conf, _ := jobtls.NodePeerTLS(ca, cert)
	srv := grpc.NewServer(append(memsnap.PeerServerOptions(), grpc.Creds(jobtls.ServerCredentials(conf, tok)))...)
	gotrainv1.RegisterSnapshotPeerServer(srv, &memsnap.PeerServer{Store: p.store, Log: p.log})
	return srv
}

// Close ends the connections to other agents.
func (p *Peers) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = map[string]*grpc.ClientConn{}
}

// Generation takes a new generation: this node is group rank groupRank of
// nodes; it publishes addr as its snapshot-peer address in it (in the
// background: the loop never waits on the coordinator).
func (p *Peers) Generation(gen int64, groupRank, nodes int, addr string) {
	if p == nil {
		return
	}
	ctx := p.ctx
	p.mu.Lock()
	p.gen, p.groupRank, p.nodes, p.addrs = gen, groupRank, nodes, map[int]peerAddr{}
	p.mu.Unlock()
	go func() {
		cctx, cancel := context.WithTimeout(ctx, peerLookupWait)
		defer cancel()
		if _, err := p.coord.KVPut(cctx, &gotrainv1.KVPutRequest{Key: peerKey(gen, groupRank), Value: []byte(p.nodeID + " " + addr)}); err != nil {
			p.log.Warn("this node's snapshot-peer address is not published: its replicas cannot be fetched in this generation", "generation", gen, "err", err)
		}
	}()
}

// lookup is the address of group rank gr in the current generation,
// waiting up to peerLookupWait for it to be published.
func (p *Peers) lookup(ctx context.Context, gr int) (peerAddr, int64, error) {
	p.mu.Lock()
	gen, pa, ok := p.gen, p.addrs[gr], false
	if pa.addr != "" {
		ok = true
	}
	p.mu.Unlock()
	if ok {
		return pa, gen, nil
	}
	cctx, cancel := context.WithTimeout(ctx, peerLookupWait+time.Second)
	defer cancel()
	r, err := p.coord.KVGet(cctx, &gotrainv1.KVGetRequest{Key: peerKey(gen, gr), WaitMs: peerLookupWait.Milliseconds()})
	if err != nil {
		return peerAddr{}, gen, fmt.Errorf("the address of node %d of generation %d: %w", gr, gen, err)
	}
	node, addr, cut := strings.Cut(string(r.GetValue()), " ")
	if !r.GetFound() || !cut {
		return peerAddr{}, gen, fmt.Errorf("node %d of generation %d published no snapshot-peer address within %s (an older gotrain, or it has none)", gr, gen, peerLookupWait)
	}
	pa = peerAddr{node: node, addr: addr}
	p.mu.Lock()
	if p.gen == gen {
		p.addrs[gr] = pa
	}
	p.mu.Unlock()
	return pa, gen, nil
}

func (p *Peers) client(pa peerAddr) (gotrainv1.SnapshotPeerClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := pa.node + "@" + pa.addr
	c := p.conns[key]
	if c == nil {
		var err error
		if c, err = p.dial(pa.addr, pa.node); err != nil {
			return nil, err
		}
		p.conns[key] = c
	}
	return gotrainv1.NewSnapshotPeerClient(c), nil
}

// Replicate sends s, which a local worker just handed over, to the ring
// neighbour (memsnap.Server.Committed). A failure is logged (once per
// cause) and costs only the replica: the own copy stays.
func (p *Peers) Replicate(ctx context.Context, s *memsnap.Snapshot) {
	p.mu.Lock()
	gr, nodes := p.groupRank, p.nodes
	p.mu.Unlock()
	if nodes < 2 {
		return
	}
	next := (gr + 1) % nodes
	ctx, cancel := context.WithTimeout(ctx, peerReplicaWait)
	defer cancel()
	err := func() error {
		pa, _, err := p.lookup(ctx, next)
		if err != nil {
			return err
		}
		c, err := p.client(pa)
		if err != nil {
			return err
		}
		if err := memsnap.Replicate(ctx, c, s, p.nodeID); err != nil {
			return fmt.Errorf("node %s at %s: %w", pa.node, pa.addr, err)
		}
		return nil
	}()
	if err == nil {
		return
	}
	cause := status.Code(err).String()
	p.mu.Lock()
	first := !p.warned[cause]
	p.warned[cause] = true
	p.mu.Unlock()
	if first {
		msg := "a snapshot was not replicated to the ring neighbour; this node's copy is kept, but a replacement of this node would resume from an older state"
		if status.Code(err) == codes.ResourceExhausted {
			msg = "the ring neighbour refused a replica: it does not fit in its --snapshot-memory (own and peers' replicas); raise --snapshot-memory there"
		}
		p.log.Warn(msg, "rank", s.Rank, "step", s.Step, "bytes", s.Size, "neighbour", next, "err", err)
	}
}

// Fetch answers a local rank the store holds nothing of
// (memsnap.Server.Fetch): it asks every other node of the generation,
// ring neighbour first, which replica of rank it holds, and fetches the
// newest.
func (p *Peers) Fetch(ctx context.Context, rank int) (memsnap.Fetched, bool, error) {
	p.mu.Lock()
	gr, nodes := p.groupRank, p.nodes
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, peerReplicaWait)
	defer cancel()
	type holder struct {
		pa         peerAddr
		c          gotrainv1.SnapshotPeerClient
		step, size int64
	}
	var best *holder
	var errs []error
	for i := 1; i < nodes; i++ {
		pa, _, err := p.lookup(ctx, (gr+i)%nodes)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c, err := p.client(pa)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hctx, hcancel := context.WithTimeout(ctx, peerLookupWait)
		info, err := c.Have(hctx, &gotrainv1.PeerSnapshotRequest{Rank: int32(rank)})
		hcancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s at %s: %w", pa.node, pa.addr, err))
			continue
		}
		if info.GetFound() && (best == nil || info.GetStep() > best.step) {
			best = &holder{pa: pa, c: c, step: info.GetStep(), size: info.GetSize()}
		}
	}
	if best == nil {
		if len(errs) > 0 {
			p.log.Warn("no peer replica of a restarted rank could be asked for", "rank", rank, "err", errors.Join(errs...))
		}
		return memsnap.Fetched{}, false, nil
	}
	start := time.Now()
	cs, done := p.fetchClients(best.pa, best.c, best.size)
	defer done()
	f, found, err := memsnap.FetchReplicaOver(ctx, cs, rank, best.step, best.size)
	if err != nil {
		p.log.Warn("the peer replica of a restarted rank could not be fetched; it resumes from its disk checkpoint", "rank", rank, "peer", best.pa.node, "err", err)
		return memsnap.Fetched{}, false, nil
	}
	if found {
		d := time.Since(start)
		p.log.Info("restored a rank from a peer's replica", "rank", rank, "step", f.Step, "bytes", f.Size, "peer", best.pa.node, "connections", len(cs),
			"seconds", d.Seconds(), "gb_per_s", float64(f.Size)/d.Seconds()/1e9)
	}
	return f, found, nil
}

// fetchClients are the clients a replica of size bytes from pa is fetched
// over: c, and for a large one further connections of their own (one TLS
// stream runs at one core's pace), up to half this node's cores and 8;
// done closes those.
func (p *Peers) fetchClients(pa peerAddr, c gotrainv1.SnapshotPeerClient, size int64) ([]gotrainv1.SnapshotPeerClient, func()) {
	n := min(8, max(1, runtime.NumCPU()/2), max(1, int(size/(64<<20))))
	cs := []gotrainv1.SnapshotPeerClient{c}
	var extra []*grpc.ClientConn
	for len(cs) < n {
		cc, err := p.dial(pa.addr, pa.node)
		if err != nil {
			break
		}
		extra = append(extra, cc)
		cs = append(cs, gotrainv1.NewSnapshotPeerClient(cc))
	}
	return cs, func() {
		for _, cc := range extra {
			cc.Close()
		}
	}
}
