package coordinator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/internal/preflight"
)

// putStore is a rendezvous in memory that keeps every key put.
type putStore struct {
	mu   sync.Mutex
	cond *sync.Cond
	kv   map[string][]byte
}

func newPutStore() *putStore {
	s := &putStore{kv: map[string][]byte{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *putStore) Put(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kv[key] = value
	s.cond.Broadcast()
	return nil
}

func (s *putStore) Get(ctx context.Context, key string) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if v, ok := s.kv[key]; ok {
			return v, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.cond.Wait()
	}
}

// TestGangKeysOwned runs a real gang check of three nodes and checks every
// key it put against gangKeyOwner: each is one the coordinator takes, and
// a node's own keys are its group rank's, the roster and verdict the
// leader's.
func TestGangKeysOwned(t *testing.T) {
	store := newPutStore()
	nodes := []string{"node-1", "node-2", "node-3"}
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			if _, err := preflight.Gang(t.Context(), preflight.QuickGang, preflight.GangNode{Generation: 2, Index: i, Nodes: nodes, Addr: "127.0.0.1", Token: "t"}, store); err != nil {
				t.Errorf("node %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if len(store.kv) < 10 {
		t.Fatalf("only %d keys put: %v", len(store.kv), store.kv)
	}
	for key := range store.kv {
		gen, gr, err := gangKeyOwner(key)
		if err != nil || gen != 2 {
			t.Errorf("key %q: generation %d, %v; want generation 2, taken", key, gen, err)
			continue
		}
		want := -2
		switch {
		case strings.HasSuffix(key, "/roster"), strings.HasSuffix(key, "/verdict"):
			want = 0
		case strings.Contains(key, "/here/"), strings.Contains(key, "/heard/"):
			fmt.Sscanf(key[strings.LastIndex(key, "/")+1:], "%d", &want)
		case strings.Contains(key, "/cpucomm/gang/"):
			want = -1
		case strings.HasSuffix(key, "/addr/0"):
			want = 0
		case strings.Contains(key, "/cpucomm/gangpair"):
			fmt.Sscanf(key[strings.Index(key, "gangpair")+len("gangpair"):], "%d", &want)
		}
		if gr != want {
			t.Errorf("key %q: owner group rank %d, want %d", key, gr, want)
		}
	}
	for _, bad := range []string{"preflight/gang/x/verdict", "preflight/gang/1/other", "preflight/gang/1/here/01", "preflight/gang/1/cpucomm/gangpair2/3/addr/1", "preflight/gang/1/cpucomm/gangpair2/1/addr/2"} {
		if _, _, err := gangKeyOwner(bad); err == nil {
			t.Errorf("key %q taken, want refused", bad)
		}
	}
}
