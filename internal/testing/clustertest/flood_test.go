package clustertest

// An outsider with many source addresses floods every
// port of the coordinator while a job joins, restarts once and finishes.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/gossip"
	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// floodEnv, set, makes this test binary the flooder: "SRC,…;HOST:PORT,…;HOLD;EVERY".
const floodEnv = "GOTRAIN_CLUSTERTEST_FLOOD"

// floodMain opens silent TCP connections from every source address to
// every target, holding up to HOLD of each pair open and opening the next
// one every EVERY (as soon as the server closed one, a new one), until
// killed; it reports its counts on stderr every 500 ms.
func floodMain() int {
	parts := strings.Split(os.Getenv(floodEnv), ";")
	if len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "flood: want", floodEnv, "= SRC,…;HOST:PORT,…;HOLD;EVERY")
		return 2
	}
	hold, _ := strconv.Atoi(parts[2])
	every, _ := time.ParseDuration(parts[3])
	var dials, open, failed atomic.Int64
	for _, src := range strings.Split(parts[0], ",") {
		for _, target := range strings.Split(parts[1], ",") {
			go func() {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
				slots := make(chan struct{}, hold)
				for {
					slots <- struct{}{}
					time.Sleep(every)
					c, err := d.Dial("tcp", target)
					dials.Add(1)
					if err != nil {
						failed.Add(1)
						<-slots
						continue
					}
					open.Add(1)
					go func() { // silent: it only waits for the server to close it
						var b [1]byte
						for {
							if _, err := c.Read(b[:]); err != nil {
								break
							}
						}
						_ = c.Close()
						open.Add(-1)
						<-slots
					}()
				}
			}()
		}
	}
	for {
		time.Sleep(500 * time.Millisecond)
		fmt.Fprintf(os.Stderr, "flood dials=%d open=%d failed=%d\n", dials.Load(), open.Load(), failed.Load())
	}
}

var floodReport = regexp.MustCompile(`flood dials=(\d+) open=(\d+) failed=(\d+)\n`)

// floodCounts is the flooder's last report.
func floodCounts(p *vcluster.Proc) (dials, open int) {
	m := floodReport.FindAllStringSubmatch(p.Stderr(), -1)
	if m == nil {
		return 0, 0
	}
	dials, _ = strconv.Atoi(m[len(m)-1][1])
	open, _ = strconv.Atoi(m[len(m)-1][2])
	return dials, open
}

// TestFloodFrom64Sources: node3, with 64 source addresses, floods node1's
// gRPC, gossip, Raft and /metrics ports with silent connections (40 held
// per source and port, a new one every 250 ms) from before node2 joins
// until the job's end. The 2-node job (the coordinator replicated on both)
// joins, restarts once after node2's worker is killed, and finishes with
// ranks that agree; node1's agent never holds more descriptors than the
// ports' unauthenticated bounds allow (before the bounds: 8192 on the gRPC
// port alone, and no join).
func TestFloodFrom64Sources(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	node1, node2, flooder := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	srcs := flooder.AddAddrs(101, 64)
	const metricsPort = "29409"
	var targets []string
	for _, port := range []string{coordPort, "29401", "29403", metricsPort} { // gRPC, gossip (+1), Raft (+3), /metrics
		targets = append(targets, net.JoinHostPort(node1.IP, port))
	}
	ckpt := t.TempDir()
	var flood *vcluster.Proc
	startFlood := func() {
		flood = flooder.StartEnv([]string{floodEnv + "=" + strings.Join(srcs, ",") + ";" + strings.Join(targets, ",") + ";40;250ms"}, os.Args[0], "-test.run=^$")
		// Node2 joins once the flood holds the ports' unauthenticated
		// budgets (about 10 s: 64 sources × 4 ports, 4 connections a
		// second each, hold 2368 at most).
		testkit.WaitFor(t, 2*time.Minute, "the flood to take hold", func() bool {
			select {
			case <-flood.Done():
				t.Fatalf("the flooder exited: %s", flood.Stderr())
			default:
			}
			dials, open := floodCounts(flood)
			return dials > 5000 && open > 1800
		})
		d, o := floodCounts(flood)
		t.Logf("node2 joins during the flood: %d connections made, %d open", d, o)
	}
	j := startJobOn(t, c, []*vcluster.Host{node1, node2}, "2", []string{"--metrics-addr", "0.0.0.0:" + metricsPort}, startFlood,
		[]string{"--verbose", "--nnodes", "2", "--max-restarts", "1", "--coordinator-replicas", "2", "--join-timeout", "2m"},
		bin.mnist, "--data", bin.data, "--epochs", "2", "--limit", "6000", "--checkpoint-dir", filepath.Join(ckpt, "ckpt"))

	// Node1's agent's descriptors, sampled until the job ends.
	agentPid := j.agents[0].Pid()
	var maxFDs atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", agentPid)); err == nil && int64(len(ents)) > maxFDs.Load() {
				maxFDs.Store(int64(len(ents)))
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	defer func() { close(stop); sampler.Wait() }()

	j.running(t)
	// The worker fault: node2's rank is SIGKILLed; the job restarts once.
	killWorker(t, node2)
	for _, p := range j.agents {
		if code, err := p.Wait(4 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent during the flood: exit %d, %v\nflooder: %s\n%s", p.Host.Name, code, err, tail(flood.Stderr(), 2), c.Dump())
		}
	}
	if gens := j.generations(); len(gens) != 2 {
		t.Errorf("generations %v; want two (the worker fault restarts the job once)", gens)
	}
	if m := mnistFinal.FindStringSubmatch(j.agents[0].Stdout()); m == nil || m[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true\n%s", m, c.Dump())
	}
	dials, open := floodCounts(flood)
	// What the ports may hold unauthenticated, and a margin for the job's
	// own descriptors.
	bound := host.MaxPendingConns + gossip.MaxStreams + replica.MaxRaftPending + host.MaxMetricsConns + 512
	t.Logf("the flood made %d connections (%d open at the end); node1's agent held at most %d descriptors (bound %d)", dials, open, maxFDs.Load(), bound)
	if n := maxFDs.Load(); n > int64(bound) {
		t.Errorf("node1's agent held %d descriptors during the flood, want at most %d", n, bound)
	}
	if dials < 8000 {
		t.Errorf("the flood made only %d connections: it did not press on the ports", dials)
	}
}

// killWorker SIGKILLs the worker (not the agent) running on h.
func killWorker(t *testing.T, h *vcluster.Host) {
	t.Helper()
	agent := h.Proc().Pid()
	for _, pid := range h.Pids() {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || pid == agent || !strings.Contains(string(cmd), filepath.Base(bin.mnist)) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no worker on %s among %v", h.Name, h.Pids())
}
