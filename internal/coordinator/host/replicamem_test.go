package host

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// heapAlloc is the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// logStats is each replica's log now.
func logStats(cs []*Coordinator) []replica.LogStats {
	out := make([]replica.LogStats, len(cs))
	for i, c := range cs {
		out[i] = c.replica.LogStats()
	}
	return out
}

// convergedLogStats is logStats once every replica holds the whole log
// (a follower may still be receiving the last entries: under load, the
// first put reached one only after "before" was taken).
func convergedLogStats(t *testing.T, cs []*Coordinator) []replica.LogStats {
	t.Helper()
	for deadline := time.Now().Add(rpcTimeout); ; time.Sleep(20 * time.Millisecond) {
		st := logStats(cs)
		same := true
		for _, s := range st {
			same = same && s.LastIndex == st[0].LastIndex && s.Bytes == st[0].Bytes
		}
		if same || time.Now().After(deadline) {
			return st
		}
	}
}

// bigJoin is a Join of about 3 MiB that passes every bound on its facts:
// 1000 GPUs with 1000-byte fields.
func bigJoin(host string, csr []byte) *gotrainv1.JoinRequest {
	n := node(host)
	long := strings.Repeat("x", 1000)
	for i := range 1000 {
		n.Gpus = append(n.Gpus, &gotrainv1.GPU{Index: int32(i), Uuid: long, PciBusId: long, Name: long})
	}
	n.Nproc = 1
	return &gotrainv1.JoinRequest{Node: n, Csr: csr}
}

// Refused requests leave nothing in the replicated log: 40
// Joins of 3 MiB into a job that started, 40 conflicting 1 MiB KV puts and
// 40 repeats of a put used to stay in every replica's log and snapshot
// history (+300 MiB a replica for the Joins alone); now the leader refuses
// them, or answers a repeat, before anything is proposed. Three real
// replicas over gRPC and Raft.
func TestRefusedRequestsLeaveNothingInTheLog(t *testing.T) {
	peers, cs := startReplicas(t, 3, 2)
	a, b := joinReplicas(t, peers, "host-a"), joinReplicas(t, peers, "host-b")
	a.hold(t) // both attach: the job starts
	b.hold(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*rpcTimeout)
	defer cancel()
	first := bytes.Repeat([]byte("v"), 1<<20)
	if _, err := a.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "k", Value: first}); err != nil {
		t.Fatal(err)
	}
	leader(t, cs)
	before, heap := convergedLogStats(t, cs), heapAlloc()

	outsider := gotrainv1.NewCoordinatorClient(replicaConn(t, peers, nil))
	_, csr, err := jobtls.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		_, err := outsider.Join(ctx, bigJoin(fmt.Sprintf("squatter-%d", i), csr))
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("join %d into a started job: %v, want FailedPrecondition", i, err)
		}
	}
	other := bytes.Repeat([]byte("w"), 1<<20)
	for i := range 40 {
		if _, err := a.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "k", Value: other}); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("conflicting put %d: %v, want AlreadyExists", i, err)
		}
		if _, err := a.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "k", Value: first}); err != nil {
			t.Fatalf("repeated put %d: %v", i, err)
		}
	}

	after, heapAfter := logStats(cs), heapAlloc()
	for i := range cs {
		// Ticks and nothing else: about 100 bytes a second.
		if grew := after[i].Bytes - before[i].Bytes; grew > 1<<20 {
			t.Errorf("replica %s: the log grew by %d bytes (%+v, was %+v), want nothing but ticks", cs[i].ReplicaID(), grew, after[i], before[i])
		}
	}
	if grew := int64(heapAfter) - int64(heap); grew > 32<<20 {
		t.Errorf("the replicas' heap grew by %d MiB, want nothing kept", grew>>20)
	}
	t.Logf("log before %+v, after %+v; heap %d MiB -> %d MiB", before, after, heap>>20, heapAfter>>20)
}

// Many accepted KV puts keep every replica's log within its bound: it is
// compacted by snapshots, and the values stay readable.
func TestAcceptedPutsKeepTheLogCompacted(t *testing.T) {
	const bound = 1 << 20
	peers, cs := startReplicas(t, 3, 1, func(c *Config) { c.maxRaftLog = bound })
	a := joinReplicas(t, peers, "host-a")
	a.hold(t) // attached, as its agent would be
	ctx, cancel := context.WithTimeout(t.Context(), 4*rpcTimeout)
	defer cancel()
	const puts, workers = 1500, 8 // 3 MB of values: 3 times the bound
	value := bytes.Repeat([]byte("v"), 2<<10)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < puts; i += workers {
				if _, err := a.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: fmt.Sprintf("key-%d", i), Value: value}); err != nil {
					errs <- fmt.Errorf("put %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, c := range cs {
		// The last compaction runs after the last put.
		deadline := time.Now().Add(rpcTimeout)
		st := c.replica.LogStats()
		for (st.Bytes > bound || st.LastIndex <= puts) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			st = c.replica.LogStats()
		}
		if st.Bytes > bound || st.LastIndex <= puts {
			t.Errorf("replica %s: %+v: want every put and at most %d bytes", c.ReplicaID(), st, bound)
		}
		if st.Snapshots == 0 {
			t.Errorf("replica %s: %+v: no snapshot compacted the log", c.ReplicaID(), st)
		}
		t.Logf("replica %s: %+v", c.ReplicaID(), st)
	}
	for _, k := range []string{"key-0", fmt.Sprintf("key-%d", puts-1)} {
		got, err := a.c.KVGet(ctx, &gotrainv1.KVGetRequest{Key: k})
		if err != nil || !bytes.Equal(got.GetValue(), value) {
			t.Errorf("get %s: %d bytes, %v", k, len(got.GetValue()), err)
		}
	}
}
