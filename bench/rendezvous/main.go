// Command rendezvous measures a coordinator's rendezvous at scale: N simulated agents in this process, each with its own gRPC
// connection, talk real gRPC to a real coordinator in a child process (so
// that its CPU time and memory are its own). Each agent calls Join with a
// node of 8 GPUs and nproc 8, as internal/launcher/join.go builds it, then
// WatchGenerations, and waits for its first GenerationStarted.
//
// For each run it reports: the time to connect every agent (TCP + HTTP/2),
// the join phase (first Join sent to the last Join's return), the time from
// the last Join's return to every agent holding its ranks, and the
// coordinator's CPU time (user+system, getrusage) and memory (live heap
// after a GC, RSS) over the rendezvous, per node.
//
// Usage, from the repository root:
//
//	go run ./bench/rendezvous -nodes 256,1024,4096 -runs 3
//	go run ./bench/rendezvous -nodes 256,1024 -hosted   # internal/coordinator/host.Start
//
// By default the child serves coordinator.New + Serve on its own loopback
// listener, in plaintext: internal/coordinator/host's listener admits at most
// host.MaxConns (8192) authenticated connections, host.MaxConnsPerIP (512)
// from one address (and host.MaxPendingConns, 1024, not yet authenticated). -hosted uses host.Start itself (gossip off: simulated agents do
// not gossip) and the agents do as internal/launcher/tls.go does: a TLS connection
// pinned on the job CA's hash, Join with a CSR, then a new connection with
// the node certificate for WatchGenerations (keys and CSRs are made before
// the clock starts); they dial from 127.0.0.2, 127.0.0.3, … (30 agents per
// address).
package main

import (
	"bufio"
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/gotrain/gotrain/internal/coordinator"
	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

const (
	roleEnv = "GOTRAIN_BENCH_RENDEZVOUS_ROLE"
	perIP   = 30 // agents per source address with -hosted (the cap is 64; each agent briefly holds two)
)

func main() {
	raiseNofile()
	if os.Getenv(roleEnv) == "coordinator" {
		if err := serve(); err != nil {
			fmt.Fprintln(os.Stderr, "rendezvous coordinator:", err)
			os.Exit(1)
		}
		return
	}
	nodes := flag.String("nodes", "256,1024,4096", "comma-separated node counts")
	ranks := flag.Int("ranks", 8, "ranks (GPUs) per node")
	runs := flag.Int("runs", 3, "runs per node count")
	hosted := flag.Bool("hosted", false, "run the coordinator with internal/coordinator/host.Start (its connection limits apply)")
	flag.Parse()
	fmt.Printf("# GOMAXPROCS=%d NumCPU=%d %s hosted=%v\n", runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), *hosted)
	fmt.Println("nodes\trun\tconnect_s\tjoin_phase_s\tlast_join_to_all_started_s\tcoord_cpu_s\tcoord_cpu_us_per_node\theap_delta_MiB\theap_B_per_node\trss_delta_MiB\trss_KiB_per_node\twith_connect_cpu_us_per_node\twith_connect_rss_KiB_per_node")
	for _, f := range strings.Split(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "-nodes: %q is not a node count\n", f)
			os.Exit(2)
		}
		for r := 1; r <= *runs; r++ {
			res, err := run(n, *ranks, *hosted)
			if err != nil {
				fmt.Printf("%d\t%d\tFAILED: %v\n", n, r, err)
				continue
			}
			cpu := res.after.cpu - res.before.cpu
			heap := res.after.heap - res.before.heap
			rss := res.after.rss - res.before.rss
			fmt.Printf("%d\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.0f\t%.1f\t%d\t%.1f\t%.1f\t%.0f\t%.1f\n", n, r,
				res.connect.Seconds(), res.joinPhase.Seconds(), res.lastJoinToStarted.Seconds(),
				cpu.Seconds(), float64(cpu.Microseconds())/float64(n),
				float64(heap)/(1<<20), heap/int64(n), float64(rss)/(1<<20), float64(rss)/1024/float64(n),
				float64((res.after.cpu-res.idle.cpu).Microseconds())/float64(n), float64(res.after.rss-res.idle.rss)/1024/float64(n))
		}
	}
}

// raiseNofile lifts the soft descriptor limit to the hard one: each agent
// holds a connection, and the coordinator one per agent.
func raiseNofile() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

// stats are the coordinator's counters at one moment.
type stats struct {
	cpu       time.Duration // user + system
	heap, rss int64         // live heap after a GC (HeapInuse), VmRSS; bytes
}

type result struct {
	connect, joinPhase, lastJoinToStarted time.Duration
	idle, before, after                   stats
}

// serve is the child: a coordinator for $NODES nodes on a loopback port.
// It prints "addr HOST:PORT", then answers each line on stdin with
// "stats CPU_NS HEAP RSS"; it exits at EOF.
func serve() error {
	nodes, _ := strconv.Atoi(os.Getenv("NODES"))
	tok := os.Getenv("TOKEN")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var addr string
	if os.Getenv("HOSTED") == "1" {
		ca, err := jobtls.NewCA("bench")
		if err != nil {
			return err
		}
		cfg := host.DefaultConfig()
		cfg.Nodes, cfg.MinNodes, cfg.JobToken, cfg.Listen, cfg.NoGossip, cfg.CA = nodes, nodes, tok, "127.0.0.1:0", true, ca
		c, err := host.Start(ctx, cfg)
		if err != nil {
			return err
		}
		defer c.Stop()
		addr = c.Addr().String() + " " + ca.Hash()
	} else {
		srv, err := coordinator.New(coordinator.Config{Job: job.Config{RunID: "bench", Nodes: nodes}, Token: tok})
		if err != nil {
			return err
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go func() { _ = srv.Serve(ctx, lis) }()
		addr = lis.Addr().String()
	}
	fmt.Println("addr", addr)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		s := readStats()
		fmt.Println("stats", int64(s.cpu), s.heap, s.rss)
	}
	return nil
}

func readStats() stats {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // before the GC below
	s := stats{cpu: time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))}
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s.heap = int64(m.HeapInuse)
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				s.rss = kb << 10
			}
		}
	}
	return s
}

// child is a running coordinator process.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	addr string
	// caHash pins the job CA of a hosted coordinator; "" in plaintext.
	caHash string
}

func startChild(n int, tok string, hosted bool) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	h := "0"
	if hosted {
		h = "1"
	}
	cmd.Env = append(os.Environ(), roleEnv+"=coordinator", "NODES="+strconv.Itoa(n), "TOKEN="+tok, "HOSTED="+h)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	if !c.out.Scan() {
		c.stop()
		return nil, errors.New("coordinator process printed no address")
	}
	c.addr, c.caHash, _ = strings.Cut(strings.TrimPrefix(c.out.Text(), "addr "), " ")
	return c, nil
}

func (c *child) stats() (stats, error) {
	if _, err := fmt.Fprintln(c.in, "stats"); err != nil {
		return stats{}, err
	}
	if !c.out.Scan() {
		return stats{}, errors.New("coordinator process ended")
	}
	var s stats
	var cpu int64
	if _, err := fmt.Sscanf(c.out.Text(), "stats %d %d %d", &cpu, &s.heap, &s.rss); err != nil {
		return stats{}, fmt.Errorf("coordinator stats %q: %w", c.out.Text(), err)
	}
	s.cpu = time.Duration(cpu)
	return s, nil
}

func (c *child) stop() {
	_ = c.in.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// run is one rendezvous of n simulated agents of ranks ranks each.
func run(n, ranks int, hosted bool) (res result, err error) {
	tok := token.Generate()
	c, err := startChild(n, tok, hosted)
	if err != nil {
		return res, err
	}
	defer c.stop()
	if res.idle, err = c.stats(); err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Every agent's connection, as launcher.go dials it, ready before the
	// clock starts.
	conns := make([]*grpc.ClientConn, n)
	defer func() {
		for _, cc := range conns {
			if cc != nil {
				_ = cc.Close()
			}
		}
	}()
	// With -hosted, each agent's node key and CSR, made before the clock
	// starts (each agent makes its own, on its own machine).
	keys := make([]nodeKey, n)
	if hosted {
		for i := range keys {
			if keys[i].key, keys[i].csr, err = jobtls.NewNodeKey(); err != nil {
				return res, err
			}
		}
	}
	dial := func(i int, cert *tls.Certificate) (*grpc.ClientConn, error) {
		creds := insecure.NewCredentials()
		opts := []grpc.DialOption{
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		}
		if hosted {
			var err error
			if creds, err = (jobtls.Trust{CAHash: c.caHash}).Credentials(tok, cert); err != nil {
				return nil, err
			}
			src := &net.TCPAddr{IP: net.IPv4(127, 0, byte((2+i/perIP)/256), byte((2+i/perIP)%256))}
			d := &net.Dialer{LocalAddr: src}
			opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
		}
		if !hosted {
			opts = append(opts, token.DialOption(tok)) // plaintext: the token on every call
		}
		return grpc.NewClient(c.addr, append(opts, grpc.WithTransportCredentials(creds))...)
	}
	t0 := time.Now()
	for i := range conns {
		if conns[i], err = dial(i, nil); err != nil {
			return res, err
		}
		conns[i].Connect()
	}
	cctx, ccancel := context.WithTimeout(ctx, time.Minute)
	defer ccancel()
	for i, cc := range conns {
		for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
			if !cc.WaitForStateChange(cctx, s) {
				return res, fmt.Errorf("agent %d of %d: connection %v after %v: %w", i, n, s, time.Since(t0).Round(time.Millisecond), cctx.Err())
			}
		}
	}
	res.connect = time.Since(t0)
	if res.before, err = c.stats(); err != nil {
		return res, err
	}

	joined := make([]time.Time, n)
	started := make([]time.Time, n)
	got := make([]*gotrainv1.GenerationStarted, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			errs[i] = agent(ctx, &conns[i], dial, keys[i], i, ranks, &joined[i], &started[i], &got[i])
		}()
	}
	t1 := time.Now()
	close(gate)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if res.after, err = c.stats(); err != nil {
		return res, err
	}
	lastJoin, lastStart := slices.MaxFunc(joined, time.Time.Compare), slices.MaxFunc(started, time.Time.Compare)
	res.joinPhase, res.lastJoinToStarted = lastJoin.Sub(t1), lastStart.Sub(lastJoin)
	return res, check(got, n, ranks)
}

// nodeKey is an agent's node key and CSR (-hosted).
type nodeKey struct {
	key crypto.Signer
	csr []byte
}

// agent is one simulated agent: Join, then watch until its first
// generation starts. With a node key it joins with its CSR and watches over
// a new connection (*conn) that presents the certificate Join issued.
func agent(ctx context.Context, conn **grpc.ClientConn, dial func(int, *tls.Certificate) (*grpc.ClientConn, error), k nodeKey, i, ranks int, joined, started *time.Time, got **gotrainv1.GenerationStarted) error {
	cl := gotrainv1.NewCoordinatorClient(*conn)
	var gpus []*gotrainv1.GPU
	for g := range ranks {
		gpus = append(gpus, &gotrainv1.GPU{Index: int32(g), Uuid: fmt.Sprintf("GPU-%08x-0000-0000-0000-%012x", i, g),
			PciBusId: fmt.Sprintf("00000000:%02X:00.0", 0x10+g), Name: "NVIDIA H200", NumaNode: int32(g / 4)})
	}
	req := &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{
		Hostname: fmt.Sprintf("node%d", i), Address: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
		Nproc: int32(ranks), AgentPid: int32(1000 + i), FreePort: 29500, Gpus: gpus,
	}, Csr: k.csr}
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	resp, err := cl.Join(jctx, req, grpc.WaitForReady(true))
	cancel()
	if err != nil {
		return fmt.Errorf("agent %d: join: %w", i, err)
	}
	*joined = time.Now()
	if k.key != nil {
		cert := jobtls.NodeCertificate(resp.GetNodeCert(), k.key)
		_ = (*conn).Close()
		if *conn, err = dial(i, &cert); err != nil {
			return fmt.Errorf("agent %d: dial with its node certificate: %w", i, err)
		}
		cl = gotrainv1.NewCoordinatorClient(*conn)
	}
	stream, err := cl.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: resp.GetNodeId()}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("agent %d: watch: %w", i, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("agent %d: watch: %w", i, err)
		}
		if st := ev.GetStarted(); st != nil {
			*started, *got = time.Now(), st
			return nil // the stream ends with ctx, after the run
		}
	}
}

// check verifies that the agents hold every rank once, ranks ranks each.
func check(got []*gotrainv1.GenerationStarted, n, ranks int) error {
	seen := make([]bool, n*ranks)
	for i, st := range got {
		if int(st.GetWorldSize()) != n*ranks || len(st.GetRanks()) != ranks {
			return fmt.Errorf("agent %d: world size %d, %d ranks; want %d, %d", i, st.GetWorldSize(), len(st.GetRanks()), n*ranks, ranks)
		}
		for _, r := range st.GetRanks() {
			if r.GetRank() < 0 || int(r.GetRank()) >= len(seen) || seen[r.GetRank()] {
				return fmt.Errorf("agent %d: rank %d out of range or held twice", i, r.GetRank())
			}
			seen[r.GetRank()] = true
		}
	}
	return nil
}
