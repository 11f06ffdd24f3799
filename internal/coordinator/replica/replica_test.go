package replica

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gotrain/gotrain/internal/netport"
	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// Every goroutine a replica starts (Raft's, its transport's, the
// leadership watcher) has ended once Stop returned.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logFSM is a replica's state: the entries applied, in order.
type logFSM struct {
	mu      sync.Mutex
	entries []string
}

func (f *logFSM) Apply(b []byte) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = append(f.entries, string(b))
	return len(f.entries)
}

func (f *logFSM) Snapshot() ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return []byte(strings.Join(f.entries, "\n")), nil
}

func (f *logFSM) Restore(b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = nil
	if len(b) > 0 {
		f.entries = strings.Split(string(b), "\n")
	}
	return nil
}

// applied is the entries applied, but for "x": a follower's proposal,
// which its Propose refuses unless it became the leader meanwhile.
func (f *logFSM) applied() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(f.entries), func(e string) bool { return e == "x" })
}

// freeAddr is a loopback address whose port was free a moment ago and
// that no connection is given meanwhile (netport).
func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := netport.Unclaimed("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

// A set of three agrees on the log; the leader's loss elects another,
// which goes on from the same log; every replica stops without leaving a
// goroutine (TestMain).
func TestThreeReplicasAgreeAndFailOver(t *testing.T) {
	var peers []Peer
	for range 3 {
		peers = append(peers, Peer{ID: freeAddr(t), RaftAddr: freeAddr(t)})
	}
	nodes := make([]*Node, len(peers))
	fsms := make([]*logFSM, len(peers))
	leads := make([]atomic.Bool, len(peers)) // what OnLeadership said last
	for i, p := range peers {
		fsms[i] = &logFSM{}
		n, err := Start(Config{ID: p.ID, RaftBind: p.RaftAddr, Peers: peers, FSM: fsms[i]})
		if err != nil {
			t.Fatal(err)
		}
		n.OnLeadership(leads[i].Store)
		nodes[i] = n
		t.Cleanup(n.Stop)
	}
	leader := func(live []*Node) *Node {
		var l *Node
		testkit.WaitFor(t, time.Minute, "a leader", func() bool {
			for _, n := range live {
				if n.Leading() {
					l = n
					return true
				}
			}
			return false
		})
		return l
	}
	// propose proposes e at the leader among live until one takes it: on a
	// loaded machine leadership may move meanwhile. A proposal cut off by
	// a lost leadership may still have been committed, so e may be in the
	// log twice in a row (want compacts).
	propose := func(live []*Node, e string) {
		t.Helper()
		testkit.WaitFor(t, time.Minute, fmt.Sprintf("a leader to take %q", e), func() bool {
			_, err := leader(live).Propose([]byte(e))
			var nl *ErrNotLeader
			if err != nil && !errors.As(err, &nl) {
				t.Fatalf("propose %q: %v", e, err)
			}
			return err == nil
		})
	}

	first := leader(nodes)
	for _, n := range nodes {
		if n == first {
			continue
		}
		_, err := n.Propose([]byte("x"))
		var nl *ErrNotLeader
		if !errors.As(err, &nl) && !n.Leading() {
			t.Fatalf("a follower's Propose: %v, want *ErrNotLeader", err)
		}
	}
	for i := range 3 {
		propose(nodes, fmt.Sprint("a", i))
	}
	first = leader(nodes)
	first.Stop()
	var live []*Node
	var liveFSMs []*logFSM
	for i, n := range nodes {
		if n != first {
			live, liveFSMs = append(live, n), append(liveFSMs, fsms[i])
		}
	}
	propose(live, "b0")
	want := []string{"a0", "a1", "a2", "b0"}
	for i, f := range liveFSMs {
		testkit.WaitFor(t, time.Minute, fmt.Sprintf("replica %s to apply %v", live[i].ID(), want), func() bool { return slices.Equal(slices.Compact(f.applied()), want) })
	}
	if a, b := liveFSMs[0].applied(), liveFSMs[1].applied(); !slices.Equal(a, b) {
		t.Errorf("the replicas' logs differ: %q and %q", a, b)
	}
	testkit.WaitFor(t, time.Minute, "OnLeadership(true) at the new leader", func() bool {
		second := leader(live)
		return leads[slices.Index(nodes, second)].Load()
	})
	for _, n := range live {
		n.Stop()
	}
}

// The log stays within its bound in bytes: many entries are compacted by
// snapshots on every replica (the state itself is kept: each applies all
// of them), and an entry over the bound is refused before it reaches the
// log.
func TestLogBoundedBySnapshots(t *testing.T) {
	const bound, entry, total = 256 << 10, 4 << 10, 400 // 1.6 MB of entries, 6 times the bound
	var peers []Peer
	for range 3 {
		peers = append(peers, Peer{ID: freeAddr(t), RaftAddr: freeAddr(t)})
	}
	nodes := make([]*Node, len(peers))
	fsms := make([]*logFSM, len(peers))
	for i, p := range peers {
		fsms[i] = &logFSM{}
		n, err := Start(Config{ID: p.ID, RaftBind: p.RaftAddr, Peers: peers, FSM: fsms[i], MaxLogBytes: bound, MaxEntryBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
		t.Cleanup(n.Stop)
	}
	var leader *Node
	lead := func() {
		testkit.WaitFor(t, time.Minute, "a leader", func() bool {
			for _, n := range nodes {
				if n.Leading() {
					leader = n
					return true
				}
			}
			return false
		})
	}
	pad := strings.Repeat("p", entry)
	for i := range total {
		// On a loaded machine leadership may move: propose at the new
		// leader (an entry cut off that way may be applied twice in a row).
		testkit.WaitFor(t, time.Minute, fmt.Sprintf("a leader to take entry %d", i), func() bool {
			lead()
			_, err := leader.Propose([]byte(fmt.Sprintf("%04d%s", i, pad)))
			var nl *ErrNotLeader
			if err != nil && !errors.As(err, &nl) {
				t.Fatalf("propose %d: %v", i, err)
			}
			return err == nil
		})
	}
	lead()
	before := leader.LogStats()
	if _, err := leader.Propose(make([]byte, 64<<10+1)); !errors.Is(err, ErrEntryTooLarge) {
		t.Errorf("a 64 KiB + 1 entry: %v, want ErrEntryTooLarge", err)
	}
	if after := leader.LogStats(); after.LastIndex != before.LastIndex {
		t.Errorf("the refused entry reached the log: last index %d, was %d", after.LastIndex, before.LastIndex)
	}
	for i, n := range nodes {
		testkit.WaitFor(t, time.Minute, fmt.Sprintf("replica %s to apply %d entries", n.ID(), total), func() bool { return len(slices.Compact(fsms[i].applied())) == total })
		var st LogStats
		testkit.WaitFor(t, time.Minute, fmt.Sprintf("replica %s's log within %d bytes", n.ID(), bound), func() bool {
			st = n.LogStats()
			return st.Bytes <= bound
		})
		if st.Snapshots == 0 || st.Entries >= total {
			t.Errorf("replica %s: %+v: want the log compacted by snapshots", n.ID(), st)
		}
		t.Logf("replica %s: %+v", n.ID(), st)
	}
}

func TestTimeoutFor(t *testing.T) {
	for _, tc := range []struct{ node, want time.Duration }{
		{10 * time.Second, time.Second},
		{2 * time.Second, DefaultHeartbeatTimeout},
		{0, DefaultHeartbeatTimeout},
		{15 * time.Second, 1500 * time.Millisecond},
		{time.Minute, 2 * time.Second},
	} {
		if got := TimeoutFor(tc.node); got != tc.want {
			t.Errorf("TimeoutFor(%v) = %v, want %v", tc.node, got, tc.want)
		}
	}
}
