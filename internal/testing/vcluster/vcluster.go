// Package vcluster builds a virtual cluster of real hosts on one Linux
// machine, for tests: each host is a network namespace with its own eth0,
// address and (per process, through a UTS namespace) hostname, plugged into
// a Linux bridge that lives in a namespace of its own. Nothing is created or
// addressed in the machine's own network namespace.
//
// The layout of a cluster with prefix P and subnet 10.77.S.0/24:
//
//	P-br     bridge namespace: br0, and h1..hN (the bridge side of each veth)
//	P-node1  eth0 10.77.S.1/24, lo     hostname node1 for processes started here
//	…
//	P-nodeN  eth0 10.77.S.N/24, lo
//
// Faults: Host.Kill, Host.Stop/Cont (signals to the host's last started
// process), Host.Partition/Heal (iptables DROP rules inside the host's
// namespace, loopback exempt), Host.LinkDown/LinkUp (the bridge side of its
// veth), Host.Blip (a partition healed after a while, in the background).
//
// Everything is removed by t.Cleanup, also when the test fails: processes
// started (and every other process left in a host's namespace), rules,
// links and namespaces. Where namespaces cannot be made (not root, no `ip`,
// no permission) New skips the test, saying why; with $CI set it fails it
// instead, because CI must run these tests.
//
// # Usage
//
//	c := vcluster.New(t, 4, vcluster.Options{})
//	p := c.Hosts[0].Start(bin, "launch", "--node-addr", c.Hosts[0].IP, …)
//	c.Hosts[2].Partition(vcluster.Both)
//	code, err := p.Wait(time.Minute)
package vcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// NamePrefix starts the name of every namespace this package makes; the
// test process's pid follows it, so that stale namespaces of a test process
// that died without cleaning up can be told apart and removed.
const NamePrefix = "gtvc"

// Options configure a cluster. The zero value is a good default.
type Options struct {
	// Env is added to the environment of every process the cluster starts
	// (after this process's own environment).
	Env []string
}

// Direction says which traffic a partition drops.
type Direction int

const (
	// Both drops the host's incoming and outgoing traffic.
	Both Direction = iota
	// In drops the traffic coming into the host only.
	In
	// Out drops the traffic leaving the host only.
	Out
)

func (d Direction) String() string {
	switch d {
	case Both:
		return "both"
	case In:
		return "in"
	case Out:
		return "out"
	}
	return "Direction(" + strconv.Itoa(int(d)) + ")"
}

// Cluster is a set of hosts on one bridge.
type Cluster struct {
	// Hosts are node1..nodeN, in order.
	Hosts []*Host

	t        testing.TB
	opts     Options
	prefix   string
	subnet   string // "10.77.S"
	bridgeNS string

	ctx    context.Context // ended at cleanup: background faults stop
	cancel context.CancelFunc
	bg     sync.WaitGroup // background faults (Blip)

	mu    sync.Mutex
	procs []*Proc
}

// Host is one host of a cluster: a network namespace.
type Host struct {
	// Name is the host's hostname, node1..nodeN.
	Name string
	// NS is the host's network namespace (see `ip netns`).
	NS string
	// IP is the host's address on the cluster's subnet.
	IP string

	c    *Cluster
	port string // the bridge side of the host's veth, in the bridge namespace

	mu   sync.Mutex
	last *Proc
}

// seq numbers the clusters this process makes: cluster k gets prefix
// gtvc<pid>-<k> and subnet 10.77.<k mod 256>.0/24. Since every cluster's
// hosts and bridge live in namespaces of their own, clusters (of this
// process or another) never see each other's addresses even where their
// subnets coincide.
var seq atomic.Int64

// New makes a cluster of n hosts for t and removes it when t ends. It
// skips t (fails it with $CI set) where namespaces cannot be made.
func New(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if n < 1 || n > 250 {
		t.Fatalf("vcluster: %d hosts: want 1 to 250", n)
	}
	if err := available(); err != nil {
		unavailable(t, err)
	}
	sweepStale(t)
	k := seq.Add(1)
	c := &Cluster{
		t:      t,
		opts:   opts,
		prefix: fmt.Sprintf("%s%d-%d", NamePrefix, os.Getpid(), k),
		subnet: fmt.Sprintf("10.77.%d", k%256),
	}
	c.bridgeNS = c.prefix + "-br"
	c.ctx, c.cancel = context.WithCancel(context.Background())
	t.Cleanup(c.teardown)

	if out, err := ipCmd("netns", "add", c.bridgeNS); err != nil {
		// The first namespace tells whether this machine lets us make them.
		unavailable(t, fmt.Errorf("ip netns add: %w: %s", err, out))
	}
	c.must("-n", c.bridgeNS, "link", "add", "br0", "type", "bridge")
	c.must("-n", c.bridgeNS, "link", "set", "br0", "up")
	c.must("-n", c.bridgeNS, "link", "set", "lo", "up")
	for i := 1; i <= n; i++ {
		h := &Host{
			Name: fmt.Sprintf("node%d", i),
			NS:   fmt.Sprintf("%s-node%d", c.prefix, i),
			IP:   fmt.Sprintf("%s.%d", c.subnet, i),
			c:    c,
			port: fmt.Sprintf("h%d", i),
		}
		c.Hosts = append(c.Hosts, h)
		c.must("netns", "add", h.NS)
		// Both ends are made in the bridge namespace, the host's end moved
		// to its namespace as eth0 at once: the root namespace never holds
		// either.
		c.must("-n", c.bridgeNS, "link", "add", h.port, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
		c.must("-n", c.bridgeNS, "link", "set", h.port, "master", "br0")
		c.must("-n", c.bridgeNS, "link", "set", h.port, "up")
		c.must("-n", h.NS, "link", "set", "lo", "up")
		c.must("-n", h.NS, "addr", "add", h.IP+"/24", "dev", "eth0")
		c.must("-n", h.NS, "link", "set", "eth0", "up")
	}
	return c
}

// Prefix is the start of the name of every namespace of c.
func (c *Cluster) Prefix() string { return c.prefix }

// Namespaces are the names of c's namespaces: the bridge's, then the hosts'.
func (c *Cluster) Namespaces() []string {
	ns := []string{c.bridgeNS}
	for _, h := range c.Hosts {
		ns = append(ns, h.NS)
	}
	return ns
}

// Procs are the processes started on c so far, in order.
func (c *Cluster) Procs() []*Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Proc(nil), c.procs...)
}

// Dump is every process's command line and output, for a failure message.
func (c *Cluster) Dump() string {
	var b strings.Builder
	for _, p := range c.Procs() {
		fmt.Fprintf(&b, "--- %s: %s (%s)\n--- stdout:\n%s--- stderr:\n%s", p.Host.Name, strings.Join(p.Args, " "), p.state(), p.Stdout(), p.Stderr())
	}
	return b.String()
}

// must runs ip with args or fails the test.
func (c *Cluster) must(args ...string) {
	c.t.Helper()
	if out, err := ipCmd(args...); err != nil {
		c.t.Fatalf("vcluster: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Start starts args (a program and its arguments) on h, with hostname
// h.Name, and returns it; see StartEnv.
func (h *Host) Start(args ...string) *Proc {
	h.c.t.Helper()
	return h.StartEnv(nil, args...)
}

// StartEnv starts args on h with env added to its environment (after the
// cluster's Options.Env). The process runs in h's network namespace and a
// UTS namespace of its own whose hostname is h.Name; its output is captured
// (Proc.Stdout, Proc.Stderr). It becomes the process that h's Kill, Stop
// and Cont signal. Cleanup kills it.
func (h *Host) StartEnv(env []string, args ...string) *Proc {
	c := h.c
	c.t.Helper()
	if len(args) == 0 {
		c.t.Fatal("vcluster: Start with no program")
	}
	// ip netns exec, unshare (without --fork) and sh's exec each exec: the
	// process started is, once running, the program itself.
	argv := append([]string{"netns", "exec", h.NS, "unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, h.Name}, args...)
	cmd := exec.Command("ip", argv...)
	cmd.Env = append(append(os.Environ(), c.opts.Env...), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A child that outlives the process (in a group of its own) may hold
	// its output open: do not wait for that child to end.
	cmd.WaitDelay = 2 * time.Second
	p := &Proc{Host: h, Args: args, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("vcluster: start %v on %s: %v", args, h.Name, err)
	}
	p.Started = time.Now()
	go func() {
		p.err = cmd.Wait()
		p.Ended = time.Now()
		close(p.done)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	h.mu.Lock()
	h.last = p
	h.mu.Unlock()
	return p
}

// Proc is the process h's faults act on: the last one started on h.
func (h *Host) Proc() *Proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// Pids are the live processes in h's network namespace: every process
// started there and their descendants (workers, their children).
func (h *Host) Pids() []int { return nsPids(h.NS) }

// Kill sends SIGKILL to h's process (Proc).
func (h *Host) Kill() { h.signal(syscall.SIGKILL) }

// Stop sends SIGSTOP to h's process (Proc): it freezes; its children run on.
func (h *Host) Stop() { h.signal(syscall.SIGSTOP) }

// Cont sends SIGCONT to h's process (Proc).
func (h *Host) Cont() { h.signal(syscall.SIGCONT) }

func (h *Host) signal(sig syscall.Signal) {
	h.c.t.Helper()
	p := h.Proc()
	if p == nil {
		h.c.t.Fatalf("vcluster: %s on %s: no process started there", sig, h.Name)
	}
	if err := p.Signal(sig); err != nil {
		h.c.t.Fatalf("vcluster: %s to %s on %s: %v", sig, p.Args[0], h.Name, err)
	}
}

// Partition drops h's traffic in direction d with iptables rules inside h's
// namespace; loopback traffic (an agent and its workers, the embedded
// coordinator) still flows. Heal removes the rules.
func (h *Host) Partition(d Direction) {
	h.c.t.Helper()
	if err := h.partition(d); err != nil {
		h.c.t.Fatal(err)
	}
}

func (h *Host) partition(d Direction) error {
	if _, err := exec.LookPath("iptables"); err != nil {
		return fmt.Errorf("vcluster: partition of %s needs iptables (Debian package iptables): %w", h.Name, err)
	}
	var rules [][]string
	if d == Both || d == In {
		rules = append(rules, []string{"-A", "INPUT", "!", "-i", "lo", "-j", "DROP"})
	}
	if d == Both || d == Out {
		rules = append(rules, []string{"-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP"})
	}
	for _, r := range rules {
		if out, err := h.exec("iptables", r...); err != nil {
			return fmt.Errorf("vcluster: partition %s (%s): iptables %s: %w: %s", h.Name, d, strings.Join(r, " "), err, out)
		}
	}
	return nil
}

// Heal removes h's partition rules (every rule in the filter table's INPUT
// and OUTPUT chains of h's namespace: the namespace is the cluster's).
func (h *Host) Heal() {
	h.c.t.Helper()
	if err := h.heal(); err != nil {
		h.c.t.Fatal(err)
	}
}

func (h *Host) heal() error {
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		if out, err := h.exec("iptables", "-F", chain); err != nil {
			return fmt.Errorf("vcluster: heal %s: iptables -F %s: %w: %s", h.Name, chain, err, out)
		}
	}
	return nil
}

// Blip partitions h both ways for d, then heals it, in the background; the
// returned channel is closed once healed. Cleanup waits for it (and cuts it
// short).
func (h *Host) Blip(d time.Duration) <-chan struct{} {
	h.c.t.Helper()
	if err := h.partition(Both); err != nil {
		h.c.t.Fatal(err)
	}
	healed := make(chan struct{})
	h.c.bg.Add(1)
	go func() {
		defer h.c.bg.Done()
		defer close(healed)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-h.c.ctx.Done():
		}
		if err := h.heal(); err != nil {
			h.c.t.Error(err)
		}
	}()
	return healed
}

// LinkDown sets the bridge side of h's veth down: h's eth0 loses its
// carrier, and the host is cut off both ways.
func (h *Host) LinkDown() { h.c.must("-n", h.c.bridgeNS, "link", "set", h.port, "down") }

// LinkUp sets the bridge side of h's veth up again.
func (h *Host) LinkUp() { h.c.must("-n", h.c.bridgeNS, "link", "set", h.port, "up") }

// AddAddrs gives h n more addresses on its eth0, SUBNET.first to
// SUBNET.first+n-1 (clear of the hosts' own while the cluster has fewer
// than first hosts), and returns them: one host that connects from many
// source addresses.
func (h *Host) AddAddrs(first, n int) []string {
	h.c.t.Helper()
	if first <= len(h.c.Hosts) || first+n-1 > 254 {
		h.c.t.Fatalf("vcluster: addresses .%d to .%d: want them above the hosts' (.1 to .%d) and at most .254", first, first+n-1, len(h.c.Hosts))
	}
	var ips []string
	for i := range n {
		ip := fmt.Sprintf("%s.%d", h.c.subnet, first+i)
		h.c.must("-n", h.NS, "addr", "add", ip+"/24", "dev", "eth0")
		ips = append(ips, ip)
	}
	return ips
}

// exec runs a command in h's network namespace (no new hostname) and
// returns its combined output.
func (h *Host) exec(name string, args ...string) ([]byte, error) {
	return ipCmd(append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Exec runs a command in h's network namespace and returns its combined
// output, for a test's own look at the host (e.g. `ip addr`).
func (h *Host) Exec(name string, args ...string) ([]byte, error) { return h.exec(name, args...) }

// teardown removes everything c made: background faults end, every process
// started is killed, then every process still in a host's namespace, then
// the namespaces (their links and rules go with them).
func (c *Cluster) teardown() {
	c.cancel()
	c.bg.Wait()
	failed := c.t.Failed()
	for _, p := range c.Procs() {
		_ = p.Signal(syscall.SIGCONT) // a stopped process's group dies too
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	for _, p := range c.Procs() {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			c.t.Errorf("vcluster: %s on %s (pid %d) did not end 10s after SIGKILL", p.Args[0], p.Host.Name, p.Pid())
		}
	}
	if failed {
		c.t.Logf("vcluster %s: processes:\n%s", c.prefix, c.Dump())
	}
	for _, ns := range c.Namespaces() {
		if err := removeNamespace(ns); err != nil {
			c.t.Errorf("vcluster: %v", err)
		}
	}
}

// removeNamespace kills every process in ns, waits for them to go, and
// deletes ns. A namespace that is not there is no error.
func removeNamespace(ns string) error {
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := nsPids(ns)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: processes %v still there 10s after SIGKILL", ns, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, err := ipCmd("netns", "del", ns); err != nil {
		return fmt.Errorf("ip netns del %s: %w: %s", ns, err, out)
	}
	return nil
}

// nsPids are the live (not zombie) processes in network namespace ns.
func nsPids(ns string) []int {
	out, err := ipCmd("netns", "pids", ns)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Alive says whether pid is a process that has not exited: a zombie (which
// pid 1 may reap late here) counts as gone.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// sweepStale removes the namespaces of test processes that died without
// cleaning up (a test binary killed by `go test -timeout`): those named
// NamePrefix<pid>- for a pid that is no longer alive.
func sweepStale(t testing.TB) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), NamePrefix)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() || Alive(pid) {
			continue
		}
		if err := removeNamespace(e.Name()); err != nil {
			t.Logf("vcluster: stale namespace of pid %d: %v", pid, err)
		}
	}
}

// available says why namespaces cannot be made here, or nil.
func available() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root")
	}
	for _, tool := range []string{"ip", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (Debian packages iproute2, util-linux): %w", tool, err)
		}
	}
	return nil
}

// unavailable skips t, or fails it where $CI is set.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("vcluster: cannot make a virtual cluster: %v (CI is set: these tests must run in CI, as root with iproute2, iptables and util-linux)", err)
	}
	t.Skipf("vcluster: cannot make a virtual cluster: %v", err)
}

func ipCmd(args ...string) ([]byte, error) {
	return exec.Command("ip", args...).CombinedOutput()
}

// Proc is a process started on a host.
type Proc struct {
	// Host is where it runs.
	Host *Host
	// Args are the program and its arguments as given to Start.
	Args []string
	// Started is when it was started; Ended when it ended (valid once Done).
	Started, Ended time.Time

	cmd            *exec.Cmd
	stdout, stderr testkit.Buffer
	done           chan struct{}
	err            error
}

// Pid is the process's id (in the machine's pid namespace).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Stdout is what it has written to stdout so far.
func (p *Proc) Stdout() string { return p.stdout.String() }

// Stderr is what it has written to stderr so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process; to one that has ended, nothing.
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// Wait waits up to d for the process to end and returns its exit code (-1
// when a signal ended it); the error says it has not ended by then.
func (p *Proc) Wait(d time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(d):
		return 0, fmt.Errorf("%s on %s has not ended after %s", p.Args[0], p.Host.Name, d)
	}
}

func (p *Proc) state() string {
	select {
	case <-p.done:
		if p.err != nil {
			return p.err.Error()
		}
		return "exit status 0"
	default:
		return "running"
	}
}
