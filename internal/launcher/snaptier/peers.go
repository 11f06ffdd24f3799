package snaptier

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/connguard"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/memsnap"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Peer replicas of the in-memory snapshot tier: the agent
// serves SnapshotPeer on --node-addr (mutual TLS with the job's node
// certificates and the proof of the job token, then only the nodes of the
// current generation, each for its own ranks: access.go; the port's
// connections bounded: bounds.go), replicates each snapshot a local worker hands over to its ring
// neighbour (the node of group rank +1 mod the nodes of the current
// generation), and answers a local rank it holds nothing of with the
// newest replica any other node of the generation holds. Agents find one
// another through the coordinator's key-value store: each publishes its
// address under the generation and its group rank (write-once keys).

// PeerKey is the key node groupRank of generation gen publishes its
// snapshot-peer address under (value: "node-id address").
func PeerKey(gen int64, groupRank int) string {
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

	mu      sync.Mutex
	gen     Generation
	started bool                        // gen is set: the agent runs a generation
	genCh   chan struct{}               // closed when the next generation is set
	addrs   map[int]peerAddr            // of the current generation, by group rank
	conns   map[string]*grpc.ClientConn // by address
	warned  map[string]bool             // one warning per cause
	guard   *connguard.Guard            // the port's connection bounds (Serve)
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
		conns: map[string]*grpc.ClientConn{}, warned: map[string]bool{}, genCh: make(chan struct{}),
	}
}

// Serve serves SnapshotPeer on lis until ctx ends: within the port's
// connection bounds (bounds.go), node certificates of the job CA both ways,
// then the proof of the token, then only the nodes of the current
// generation, each for its own ranks (access.go). It closes lis.
func (p *Peers) Serve(ctx context.Context, lis net.Listener, tok string, ca *x509.Certificate, cert tls.Certificate) error {
	gl := connguard.Listen(lis, "the snapshot peer port", PeerLimits, p.log)
	p.mu.Lock()
	p.guard = gl.Guard
	p.mu.Unlock()
	conf, _ := jobtls.NodePeerTLS(ca, cert)
	opts := append(memsnap.PeerServerOptions(), grpc.Creds(jobtls.ServerCredentials(conf, tok)))
	srv := grpc.NewServer(append(opts, serverBounds()...)...)
	gotrainv1.RegisterSnapshotPeerServer(srv, &memsnap.PeerServer{Store: p.store, Access: access{p}, Log: p.log})
	stop := context.AfterFunc(ctx, srv.Stop)
	defer stop()
	return srv.Serve(gl)
}

// access is the peer port's memsnap.PeerAccess: the caller's node and rank
// against the generation this agent runs (access.go).
type access struct{ p *Peers }

var _ memsnap.PeerAccess = access{}

func (a access) MayReplicate(ctx context.Context, node string, gen int64, rank int) error {
	return a.p.may(ctx, node, gen, "replicate", rank)
}

func (a access) MayFetch(ctx context.Context, node string, gen int64, rank int) error {
	return a.p.may(ctx, node, gen, "fetch", rank)
}

// may decides a call of node, in generation gen, once this agent runs gen
// too (or waited peerLookupWait for it: the caller may have learned of it
// first), and marks the call's connection authenticated when it passes: a
// connection that made no call that passed stays within the
// unauthenticated budget and its handshake deadline.
func (p *Peers) may(ctx context.Context, node string, gen int64, call string, rank int) error {
	g, started := p.waitGeneration(ctx, gen)
	if err := mayCall(g, started, node, call, rank); err != nil {
		return err
	}
	p.mu.Lock()
	guard := p.guard
	p.mu.Unlock()
	pr, ok := peer.FromContext(ctx)
	if guard == nil || !ok {
		return nil
	}
	if err := guard.MarkAuthenticated(pr.LocalAddr, pr.Addr); err != nil {
		return fmt.Errorf("the snapshot peer port of node %s holds its maximum of %d authenticated connections (%w): try again later", p.nodeID, guard.Limits().Authenticated, err)
	}
	return nil
}

// waitGeneration is the generation this agent runs, once it is gen or
// later, or after peerLookupWait (or ctx's end) when it is not.
func (p *Peers) waitGeneration(ctx context.Context, gen int64) (Generation, bool) {
	timer := time.NewTimer(peerLookupWait)
	defer timer.Stop()
	for {
		p.mu.Lock()
		g, started, next := p.gen, p.started, p.genCh
		p.mu.Unlock()
		if started && g.Gen >= gen {
			return g, started
		}
		select {
		case <-next:
		case <-timer.C:
			return g, started
		case <-ctx.Done():
			return g, started
		}
	}
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

// Generation takes a new generation g, with the job's snapshot key; it
// publishes addr as this node's snapshot-peer address in it (in the
// background: the loop never waits on the coordinator), nothing when addr
// is "" (the port does not listen).
func (p *Peers) Generation(g Generation, addr string) {
	if p == nil {
		return
	}
	ctx := p.ctx
	if len(g.Key) > 0 {
		p.store.SetKey(g.Key)
	}
	gen, groupRank := g.Gen, g.GroupRank
	p.mu.Lock()
	p.gen, p.started, p.addrs = g, true, map[int]peerAddr{}
	close(p.genCh)
	p.genCh = make(chan struct{})
	p.mu.Unlock()
	if addr == "" {
		return
	}
	go func() {
		cctx, cancel := context.WithTimeout(ctx, peerLookupWait)
		defer cancel()
		if _, err := p.coord.KVPut(cctx, &gotrainv1.KVPutRequest{Key: PeerKey(gen, groupRank), Value: []byte(p.nodeID + " " + addr)}); err != nil {
			p.log.Warn("this node's snapshot-peer address is not published: its replicas cannot be fetched in this generation", "generation", gen, "err", err)
		}
	}()
}

// lookup is the address of group rank gr in the current generation,
// waiting up to peerLookupWait for it to be published.
func (p *Peers) lookup(ctx context.Context, gr int) (peerAddr, int64, error) {
	p.mu.Lock()
	gen, want, pa, ok := p.gen.Gen, p.gen.byGroupRank(gr), p.addrs[gr], false
	if pa.addr != "" {
		ok = true
	}
	p.mu.Unlock()
	if ok {
		return pa, gen, nil
	}
	cctx, cancel := context.WithTimeout(ctx, peerLookupWait+time.Second)
	defer cancel()
	r, err := p.coord.KVGet(cctx, &gotrainv1.KVGetRequest{Key: PeerKey(gen, gr), WaitMs: peerLookupWait.Milliseconds()})
	if err != nil {
		return peerAddr{}, gen, fmt.Errorf("the address of node %d of generation %d: %w", gr, gen, err)
	}
	node, addr, cut := strings.Cut(string(r.GetValue()), " ")
	if !r.GetFound() || !cut {
		return peerAddr{}, gen, fmt.Errorf("node %d of generation %d published no snapshot-peer address within %s (an older gotrain, or it has none)", gr, gen, peerLookupWait)
	}
	if node != want {
		// Only node gr may put the key (internal/coordinator/identity.go); this is
		// the agent's own check of the same.
		return peerAddr{}, gen, fmt.Errorf("the snapshot-peer address of node %d of generation %d names node %q, but that group rank is node %q's", gr, gen, node, want)
	}
	pa = peerAddr{node: node, addr: addr}
	p.mu.Lock()
	if p.gen.Gen == gen {
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
	gr, nodes, gen := p.gen.GroupRank, len(p.gen.Members), p.gen.Gen
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
		if err := memsnap.Replicate(ctx, c, s, p.nodeID, gen); err != nil {
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
		switch status.Code(err) {
		case codes.ResourceExhausted:
			msg = "the ring neighbour refused a replica: it does not fit in its --snapshot-memory (own and peers' replicas); raise --snapshot-memory there"
		case codes.PermissionDenied:
			msg = "the ring neighbour refused a replica: it does not count this node, or this rank, in the generation it runs, or the replica's MAC failed (the error says which); this node's copy is kept. If it persists, the nodes disagree on the generation: check both agents' logs"
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
	gr, nodes, gen := p.gen.GroupRank, len(p.gen.Members), p.gen.Gen
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
		info, err := c.Have(hctx, &gotrainv1.PeerSnapshotRequest{Rank: int32(rank), Generation: gen})
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
	f, found, err := memsnap.FetchReplicaOver(ctx, cs, rank, gen, best.step, best.size)
	if err == nil && found {
		err = p.store.CheckFetched(rank, f) // again, as the peer's word is not enough
	}
	if err != nil {
		p.log.Warn("the peer replica of a restarted rank could not be fetched, or failed its checks; it resumes from its disk checkpoint", "rank", rank, "peer", best.pa.node, "err", err)
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
