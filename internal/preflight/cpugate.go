package preflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// CPUGateConfig is what the CPU backend's gate measures and expects.
type CPUGateConfig struct {
	// Ranks all-reduce together on this node, over TCP on Host.
	Ranks int
	Host  string
	// Bytes is the large all-reduce's size; Rounds how many of it (and of
	// the small one) are timed after one warm-up round.
	Bytes, Rounds int
	// Budget bounds the whole measurement: a node too slow to finish in it
	// fails with the bound it reached.
	Budget time.Duration
	// MinBusBW (MB/s) and MaxLatency are the gate.
	MinBusBW   float64
	MaxLatency time.Duration
}

// QuickCPU and FullCPU are the gate of --preflight quick and full. The
// thresholds are far below what a healthy node does (GB/s and tens of
// microseconds over loopback on two shared cores) and far above what a node
// held to a small CPU quota does: they catch a node that would make every
// step of the job wait, not a node a little slower than its peers.
var (
	QuickCPU = CPUGateConfig{Ranks: 2, Host: "127.0.0.1", Bytes: 4 << 20, Rounds: 5, Budget: 5 * time.Second, MinBusBW: 25, MaxLatency: 50 * time.Millisecond}
	FullCPU  = CPUGateConfig{Ranks: 4, Host: "127.0.0.1", Bytes: 32 << 20, Rounds: 10, Budget: 30 * time.Second, MinBusBW: 25, MaxLatency: 50 * time.Millisecond}
)

// smallBytes is the latency all-reduce's size: one float64, as a loss
// average or a barrier sends.
const smallBytes = 8

// CPUGate runs the CPU backend's all-reduce between cfg.Ranks ranks of this
// node and returns its bus bandwidth and latency figures. An error is a gate
// that could not run at all (no port to listen on).
func CPUGate(ctx context.Context, cfg CPUGateConfig) ([]Figure, error) {
	if cfg.Ranks < 2 {
		return nil, fmt.Errorf("preflight: the CPU gate needs at least 2 ranks, got %d", cfg.Ranks)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	// Out of budget, not stopped: then the figures are bounds.
	outOfTime := func() bool { return ctx.Err() != nil && parent.Err() == nil }
	start := time.Now()
	store := newLocalStore()
	// A secret of this gate's alone: another local process that connects to
	// a rank's listener cannot take a rank's place.
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(secret)
	comms := make([]*cpucomm.Comm, cfg.Ranks)
	errs := make([]error, cfg.Ranks)
	var wg sync.WaitGroup
	for r := range cfg.Ranks {
		wg.Go(func() {
			comms[r], errs[r] = cpucomm.New(ctx, cpucomm.Config{Name: "preflight", Rank: r, Size: cfg.Ranks, Host: cfg.Host, Store: store, Token: token})
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		if outOfTime() {
			// Too slow even to connect: both figures are bounds.
			return cpuFigures(cfg, 0, cfg.Budget, true, true), nil
		}
		return nil, fmt.Errorf("preflight: the CPU gate's ranks could not connect: %w", err)
	}

	// Latency: the median of Rounds small all-reduces, after a warm-up.
	lat := make([]time.Duration, cfg.Rounds)
	if err := onAll(comms, func(r int, c *cpucomm.Comm) error {
		buf := make([]float64, smallBytes/8)
		for i := -1; i < cfg.Rounds; i++ {
			t0 := time.Now()
			if err := c.AllReduce(ctx, comm.Host(buf), comm.Host(buf), comm.Sum); err != nil {
				return err
			}
			if r == 0 && i >= 0 {
				lat[i] = time.Since(t0)
			}
		}
		return nil
	}); err != nil {
		if outOfTime() {
			return cpuFigures(cfg, 0, time.Since(start), true, true), nil
		}
		return nil, fmt.Errorf("preflight: the CPU gate's latency all-reduce: %w", err)
	}
	slices.Sort(lat)
	median := lat[len(lat)/2]

	elapsed, done, err := cpuBandwidth(ctx, comms, cfg)
	if err != nil && !outOfTime() {
		return nil, fmt.Errorf("preflight: the CPU gate's bandwidth all-reduce: %w", err)
	}
	if err != nil {
		// Out of time: the rounds that finished, plus the one that did
		// not, bound the bandwidth from above.
		if elapsed == 0 {
			elapsed = time.Since(start)
		}
		return cpuFigures(cfg, busBW(cfg, done+1, elapsed), median, true, false), nil
	}
	return cpuFigures(cfg, busBW(cfg, done, elapsed), median, false, false), nil
}

// cpuBandwidth runs Rounds large all-reduces on comms after a warm-up and
// returns the time they took together, and how many finished (all of them
// unless err: the budget ended first, and the rounds done bound the
// bandwidth). Together, not the fastest round: a node held to a CPU quota
// runs a round now and then at full speed, when the round fits in what is
// left of its quota period, but is slow over several periods.
func cpuBandwidth(ctx context.Context, comms []*cpucomm.Comm, cfg CPUGateConfig) (elapsed time.Duration, done int, err error) {
	err = onAll(comms, func(r int, c *cpucomm.Comm) error {
		buf := make([]float32, cfg.Bytes/4)
		var start time.Time
		for i := -1; i < cfg.Rounds; i++ {
			if i == 0 {
				start = time.Now()
			}
			if err := c.AllReduce(ctx, comm.Host(buf), comm.Host(buf), comm.Sum); err != nil {
				if r == 0 && i >= 0 {
					elapsed, done = time.Since(start), i
				}
				return err
			}
		}
		if r == 0 {
			elapsed, done = time.Since(start), cfg.Rounds
		}
		return nil
	})
	return elapsed, done, err
}

// busBW is the all-reduce's bus bandwidth in MB/s, as nccl-tests computes
// it: the algorithm bandwidth times 2(n-1)/n, the share of the buffer each
// rank sends and receives.
func busBW(cfg CPUGateConfig, rounds int, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	alg := float64(cfg.Bytes) * float64(rounds) / elapsed.Seconds() / 1e6
	return alg * 2 * float64(cfg.Ranks-1) / float64(cfg.Ranks)
}

func cpuFigures(cfg CPUGateConfig, bw float64, lat time.Duration, bwBound, latBound bool) []Figure {
	detail := fmt.Sprintf("%d ranks, %s", cfg.Ranks, byteSize(cfg.Bytes))
	return []Figure{
		{Check: CheckCPUBusBW, Measured: bw, Want: cfg.MinBusBW, Unit: "MB/s", Below: bwBound, Detail: detail},
		{Check: CheckCPULat, Measured: ms(lat), Want: ms(cfg.MaxLatency), Unit: "ms", AtMost: true, Below: latBound,
			Detail: fmt.Sprintf("%d ranks, %d B, median", cfg.Ranks, smallBytes)},
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func byteSize(b int) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%d GiB", b>>30)
	case b >= 1<<20:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<10:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}

// onAll runs f on every rank at once and returns the first error.
func onAll(comms []*cpucomm.Comm, f func(r int, c *cpucomm.Comm) error) error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			if errs[r] = f(r, c); errs[r] != nil {
				// One rank's failure would leave the others waiting
				// on it: close them all.
				for _, o := range comms {
					o.Close()
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// localStore is the gate's rendezvous: its ranks are goroutines of this
// process, so nothing leaves it.
type localStore struct {
	mu     sync.Mutex
	values map[string][]byte
	ready  map[string]chan struct{}
}

var _ comm.Store = (*localStore)(nil)

func newLocalStore() *localStore {
	return &localStore{values: map[string][]byte{}, ready: map[string]chan struct{}{}}
}

func (s *localStore) wait(key string) chan struct{} {
	ch, ok := s.ready[key]
	if !ok {
		ch = make(chan struct{})
		s.ready[key] = ch
	}
	return ch
}

func (s *localStore) Put(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.values[key]; ok {
		return fmt.Errorf("preflight: key %s put twice", key)
	}
	s.values[key] = value
	close(s.wait(key))
	return nil
}

func (s *localStore) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	ch := s.wait(key)
	s.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.values[key], nil
}
