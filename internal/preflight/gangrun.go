package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// GangNode is this node's place in the gang.
type GangNode struct {
	// Generation scopes the rendezvous keys: a later generation's gang
	// never reads an earlier one's.
	Generation int64
	// Index is this node's place (0: the leader, which measures and
	// decides); Nodes the node ids by place, Hosts their hostnames as the
	// coordinator knows them ("" where unknown: the node id names it).
	Index int
	Nodes []string
	Hosts []string
	// Addr is the address this node listens on for the others.
	Addr string
	// Token proves every connection of the gang (the job token).
	Token string
	// Elastic: the leader's word that the job runs under --nnodes
	// MIN:MAX (GangVerdict.Elastic).
	Elastic bool
	// Serves: this node runs the coordinator, which the others read the
	// verdict from; it returns once they have (or after a bound), not
	// before, since it may stop the coordinator next.
	Serves bool
}

// maxGangNodes bounds the members a gang check takes.
const maxGangNodes = 4096

// Gang runs the gang check from this node: store is the job's rendezvous
// (the coordinator's KV store), shared by every node of the generation.
// Every member returns the leader's verdict; a member that does not hear it
// in time returns the verdict that names the leader. An error is a check
// that could not run here at all.
func Gang(ctx context.Context, cfg GangConfig, me GangNode, store comm.Store) (GangVerdict, error) {
	n := len(me.Nodes)
	if n < 2 || n > maxGangNodes || me.Index < 0 || me.Index >= n {
		return GangVerdict{}, fmt.Errorf("preflight: gang place %d of %d nodes (want 2 to %d nodes)", me.Index, n, maxGangNodes)
	}
	host := func(i int) string {
		if i < len(me.Hosts) && me.Hosts[i] != "" {
			return me.Hosts[i]
		}
		return me.Nodes[i]
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, start.Add(cfg.Total()))
	defer cancel()
	keys := gangKeys{gen: me.Generation}
	if err := store.Put(ctx, keys.here(me.Index), []byte(me.Nodes[me.Index])); err != nil {
		return GangVerdict{}, fmt.Errorf("preflight: join the gang: %w", err)
	}

	roster, err := gangRoster(ctx, cfg, me, store, keys, start)
	if err != nil {
		return GangVerdict{}, err
	}
	if roster == nil {
		return leaderMissing(me, host(0), cfg), nil
	}
	pos := slices.Index(roster, me.Index)
	var gangFigs []Figure
	pairs, skipped := map[int][]Figure{}, map[int]bool{}
	if pos >= 0 && len(roster) >= 2 {
		// The gang's all-reduce, then each node's with the leader; half
		// the budget each.
		gangFigs = gangAllReduce(ctx, cfg, me, store, keys, roster, pos, start.Add(cfg.JoinWait+cfg.Budget/2))
		pairs, skipped = gangPairs(ctx, cfg, me, store, keys, roster, start.Add(cfg.JoinWait+cfg.Budget))
	}
	if me.Index == 0 {
		f := GangFigures{JoinWait: cfg.JoinWait, Gang: gangFigs}
		for i := range n {
			m := GangMember{NodeID: me.Nodes[i], Host: host(i), Joined: slices.Contains(roster, i), Pair: pairs[i], Skipped: skipped[i]}
			for k := range m.Pair {
				m.Pair[k].Subject = "link to " + host(0)
			}
			f.Members = append(f.Members, m)
		}
		v := JudgeGang(f)
		v.Elastic = me.Elastic
		b, _ := json.Marshal(v)
		if err := store.Put(ctx, keys.verdict(), b); err != nil {
			return v, fmt.Errorf("preflight: publish the gang's verdict: %w", err)
		}
		gangHeard(ctx, store, keys, me, roster)
		return v, nil
	}
	b, err := store.Get(ctx, keys.verdict())
	var v GangVerdict
	if err != nil || json.Unmarshal(b, &v) != nil || !v.valid() {
		if errors.Is(err, context.Canceled) {
			return GangVerdict{}, err
		}
		return leaderMissing(me, host(0), cfg), nil
	}
	_ = store.Put(ctx, keys.heard(me.Index), []byte(me.Nodes[me.Index]))
	gangHeard(ctx, store, keys, me, roster)
	return v, nil
}

// gangRoster is who joined in time. The leader decides it; every member
// reads it, so that all run the same all-reduce. A member that cannot read
// a valid roster gets nil (the leader is missing).
func gangRoster(ctx context.Context, cfg GangConfig, me GangNode, store comm.Store, keys gangKeys, start time.Time) ([]int, error) {
	if me.Index == 0 {
		roster := gangJoin(ctx, store, keys, me.Nodes, start.Add(cfg.JoinWait))
		b, _ := json.Marshal(roster)
		if err := store.Put(ctx, keys.roster(), b); err != nil {
			return nil, fmt.Errorf("preflight: publish the gang's roster: %w", err)
		}
		return roster, nil
	}
	rctx, rcancel := context.WithDeadline(ctx, start.Add(cfg.JoinWait+verdictSlack))
	b, err := store.Get(rctx, keys.roster())
	rcancel()
	if ctx.Err() != nil && rctx.Err() == nil {
		return nil, ctx.Err()
	}
	var roster []int
	if err != nil || json.Unmarshal(b, &roster) != nil || !validRoster(roster, len(me.Nodes)) {
		return nil, nil
	}
	return roster, nil
}

// gangAllReduce is the all-reduce of every node of roster, measured by the
// node at place pos; the leader reports bounds when some node never
// connected before deadline.
func gangAllReduce(ctx context.Context, cfg GangConfig, me GangNode, store comm.Store, keys gangKeys, roster []int, pos int, deadline time.Time) []Figure {
	sctx, scancel := context.WithDeadline(ctx, deadline)
	defer scancel()
	detail := fmt.Sprintf("%d nodes", len(roster))
	c, err := cpucomm.New(sctx, cpucomm.Config{Name: "gang", Generation: me.Generation, Rank: pos, Size: len(roster),
		Host: me.Addr, Store: prefixStore{keys.prefix(), store}, Token: me.Token})
	if err != nil {
		if pos == 0 {
			// Some node never connected: the gang ran out of time.
			return gangBounds(cfg, cfg.Bytes, detail)
		}
		return nil
	}
	defer c.Close()
	return gangMeasure(sctx, c, pos, cfg, cfg.Bytes, detail)
}

// gangPairs is each node's all-reduce with the leader, connected at once
// and measured one after the other: pairs measured together would share
// the leader's link, and each would look slow. A pair the budget left no
// time for is skipped, not blamed; one that never connected has no
// figures, which blames it. Only the leader's figures are returned.
func gangPairs(ctx context.Context, cfg GangConfig, me GangNode, store comm.Store, keys gangKeys, roster []int, deadline time.Time) (map[int][]Figure, map[int]bool) {
	pairs := make(map[int][]Figure)
	skipped := make(map[int]bool)
	pctx, pcancel := context.WithDeadline(ctx, deadline)
	defer pcancel()
	pairCfg := func(j, rank int) cpucomm.Config {
		return cpucomm.Config{Name: "gangpair" + strconv.Itoa(j), Generation: me.Generation, Rank: rank, Size: 2,
			Host: me.Addr, Store: prefixStore{keys.prefix(), store}, Token: me.Token}
	}
	if me.Index != 0 {
		if c, err := cpucomm.New(pctx, pairCfg(me.Index, 1)); err == nil {
			gangMeasure(pctx, c, 1, cfg, cfg.PairBytes, "2 nodes")
			c.Close()
		}
		return pairs, skipped
	}
	comms := make(map[int]*cpucomm.Comm)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, j := range roster[1:] {
		wg.Go(func() {
			if c, err := cpucomm.New(pctx, pairCfg(j, 0)); err == nil {
				mu.Lock()
				comms[j] = c
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	for _, j := range roster[1:] {
		c := comms[j]
		switch {
		case c == nil:
		case pctx.Err() != nil:
			skipped[j] = true
		default:
			pairs[j] = gangMeasure(pctx, c, 0, cfg, cfg.PairBytes, "2 nodes")
		}
	}
	return pairs, skipped
}

// gangHeard waits, on the node that serves the rendezvous, until every
// other member of roster has read the verdict, for at most verdictSlack.
func gangHeard(ctx context.Context, store comm.Store, keys gangKeys, me GangNode, roster []int) {
	if !me.Serves {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, verdictSlack)
	defer cancel()
	var wg sync.WaitGroup
	for _, j := range roster {
		if j != me.Index && j != 0 {
			wg.Go(func() { _, _ = store.Get(hctx, keys.heard(j)) })
		}
	}
	wg.Wait()
}

// gangJoin waits until deadline for each node's join and returns the
// places that joined, in order.
func gangJoin(ctx context.Context, store comm.Store, keys gangKeys, nodes []string, deadline time.Time) []int {
	jctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	joined := make([]bool, len(nodes))
	joined[0] = true
	var wg sync.WaitGroup
	for i := 1; i < len(nodes); i++ {
		wg.Go(func() {
			b, err := store.Get(jctx, keys.here(i))
			// The key holds the node id of that place: anything else is
			// not the node the coordinator put there.
			joined[i] = err == nil && string(b) == nodes[i]
		})
	}
	wg.Wait()
	var roster []int
	for i, ok := range joined {
		if ok {
			roster = append(roster, i)
		}
	}
	return roster
}

func validRoster(r []int, n int) bool {
	if len(r) == 0 || len(r) > n || r[0] != 0 {
		return false
	}
	for i, x := range r {
		if x < 0 || x >= n || (i > 0 && x <= r[i-1]) {
			return false
		}
	}
	return true
}

// leaderMissing is a member's verdict when the leader's roster or verdict
// never came: the leader is out.
func leaderMissing(me GangNode, leaderHost string, cfg GangConfig) GangVerdict {
	return GangVerdict{Out: []Verdict{{Node: leaderHost, Check: CheckGangJoin,
		Measured: fmt.Sprintf("its part of the check did not come within %s", cfg.Total()), Expected: "the leader of the check answers", Fix: gangJoinFix}},
		OutIDs: []string{me.Nodes[0]}}
}

// maxVerdictText bounds each string of a verdict read from the store: it is
// another process's, printed here.
const maxVerdictText = 2048

// valid checks a verdict read from the store before it is used.
func (v GangVerdict) valid() bool {
	if len(v.Out) != len(v.OutIDs) || len(v.Out) > maxGangNodes || len(v.Gang) > 8 {
		return false
	}
	for _, x := range append(slices.Clone(v.Gang), v.Out...) {
		for _, s := range []string{x.Node, string(x.Check), x.Subject, x.Measured, x.Expected, x.Fix} {
			if len(s) > maxVerdictText || !utf8.ValidString(s) || containsControl(s) {
				return false
			}
		}
	}
	for _, id := range v.OutIDs {
		if len(id) > maxVerdictText {
			return false
		}
	}
	return true
}

func containsControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// gangMeasure runs a communicator's latency and bandwidth all-reduces and
// returns rank 0's figures (nil on other ranks). A communicator that does
// not finish within ctx gives bounds.
func gangMeasure(ctx context.Context, c *cpucomm.Comm, rank int, cfg GangConfig, bytes int, detail string) []Figure {
	rounds := max(cfg.Rounds, 1)
	figs := func(bw float64, lat time.Duration, bwBound, latBound bool) []Figure {
		if rank != 0 {
			return nil
		}
		return gangFigures(cfg, bytes, detail, bw, lat, bwBound, latBound)
	}
	lat := make([]time.Duration, rounds)
	small := make([]float64, smallBytes/8)
	for i := -1; i < rounds; i++ {
		t0 := time.Now()
		if err := c.AllReduce(ctx, comm.Host(small), comm.Host(small), comm.Sum); err != nil {
			return figs(0, time.Since(t0), true, true)
		}
		if i >= 0 {
			lat[i] = time.Since(t0)
		}
	}
	slices.Sort(lat)
	median := lat[len(lat)/2]
	// The bandwidth is the fastest round's: a link that is slow is slow
	// in every round, while a busy host (the job's own start, a
	// neighbour's build) delays some rounds and not others.
	buf := make([]float32, bytes/4)
	var start time.Time
	best := time.Duration(0)
	for i := -1; i < rounds; i++ {
		t0 := time.Now()
		if i == 0 {
			start = t0
		}
		if err := c.AllReduce(ctx, comm.Host(buf), comm.Host(buf), comm.Sum); err != nil {
			if i < 0 {
				return figs(0, median, true, false) // not even the warm-up round
			}
			// The rounds that finished, plus the one that did not,
			// bound the bandwidth from above.
			return figs(ringBusBW(bytes, c.Size(), i+1, time.Since(start)), median, true, false)
		}
		if d := time.Since(t0); i >= 0 && (best == 0 || d < best) {
			best = d
		}
	}
	return figs(ringBusBW(bytes, c.Size(), 1, best), median, false, false)
}

// gangBounds are the figures of a communicator that never connected.
func gangBounds(cfg GangConfig, bytes int, detail string) []Figure {
	return gangFigures(cfg, bytes, detail, 0, cfg.Budget/2, true, true)
}

func gangFigures(cfg GangConfig, bytes int, detail string, bw float64, lat time.Duration, bwBound, latBound bool) []Figure {
	return []Figure{
		{Check: CheckGang, Measured: bw, Want: cfg.MinBusBW, Unit: "MB/s", Below: bwBound, Detail: fmt.Sprintf("%s, %s", detail, byteSize(bytes))},
		{Check: CheckGangLatency, Measured: ms(lat), Want: ms(cfg.MaxLatency), Unit: "ms", AtMost: true, Below: latBound, Detail: fmt.Sprintf("%s, %d B, median", detail, smallBytes)},
	}
}

// ringBusBW is busBW for n participants.
func ringBusBW(bytes, n, rounds int, elapsed time.Duration) float64 {
	return busBW(CPUGateConfig{Bytes: bytes, Ranks: n}, rounds, elapsed)
}

// gangKeys are the gang's keys in the job's store.
type gangKeys struct{ gen int64 }

func (k gangKeys) prefix() string    { return fmt.Sprintf("preflight/gang/%d/", k.gen) }
func (k gangKeys) here(i int) string { return k.prefix() + "here/" + strconv.Itoa(i) }
func (k gangKeys) roster() string    { return k.prefix() + "roster" }
func (k gangKeys) verdict() string   { return k.prefix() + "verdict" }

// prefixStore puts the gang's communicators' keys under the gang's prefix:
// they are not a job communicator's, which only a rank's own node may put.
type prefixStore struct {
	prefix string
	s      comm.Store
}

func (p prefixStore) Put(ctx context.Context, key string, value []byte) error {
	return p.s.Put(ctx, p.prefix+key, value)
}

func (p prefixStore) Get(ctx context.Context, key string) ([]byte, error) {
	return p.s.Get(ctx, p.prefix+key)
}

func (k gangKeys) heard(i int) string { return k.prefix() + "heard/" + strconv.Itoa(i) }
