package vcluster_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// helperEnv makes this test binary a helper program started on a host:
// "serve" answers every connection on :7000 with its hostname; "dial ADDR"
// prints what ADDR answers, or exits 1 after a short timeout; "sleep" sleeps.
const helperEnv = "VCLUSTER_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "serve":
		l, err := net.Listen("tcp", ":7000")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		name, _ := os.Hostname()
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			fmt.Fprintln(c, name)
			c.Close()
		}
	case "dial":
		c, err := net.DialTimeout("tcp", os.Args[1], 500*time.Millisecond)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(line)
		os.Exit(0)
	case "sleep":
		time.Sleep(time.Hour)
	}
}

func self(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// dial runs "dial" on from towards to's server and returns what it printed
// ("" when it could not connect).
func dial(t *testing.T, from, to *vcluster.Host) string {
	t.Helper()
	p := from.StartEnv([]string{helperEnv + "=dial"}, self(t), to.IP+":7000")
	code, err := p.Wait(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		return ""
	}
	return strings.TrimSpace(p.Stdout())
}

// reaches waits up to 5 s for from to reach to (a link just set up may take
// a moment) and says whether it did.
func reaches(t *testing.T, from, to *vcluster.Host) bool {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if got := dial(t, from, to); got != "" {
			if got != to.Name {
				t.Errorf("%s answered with hostname %q, want %q", to.IP, got, to.Name)
			}
			return true
		}
	}
	return false
}

// TestFaults: hosts reach each other by address and have their own
// hostnames; each fault cuts what it should and healing restores it.
func TestFaults(t *testing.T) {
	t.Parallel()
	c := vcluster.New(t, 3, vcluster.Options{})
	a, b, x := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	b.StartEnv([]string{helperEnv + "=serve"}, self(t))
	x.StartEnv([]string{helperEnv + "=serve"}, self(t))
	if !reaches(t, a, b) || !reaches(t, a, x) {
		t.Fatalf("hosts do not reach each other\n%s", c.Dump())
	}
	if out, err := a.Exec("ip", "-4", "-o", "addr", "show", "dev", "eth0"); err != nil || !strings.Contains(string(out), a.IP+"/24") {
		t.Errorf("node1's eth0: %v %s", err, out)
	}
	for _, tc := range []struct {
		name       string
		cut, heal  func()
		from, to   *vcluster.Host
		stillWorks [2]*vcluster.Host
	}{
		{"partition both", func() { b.Partition(vcluster.Both) }, b.Heal, a, b, [2]*vcluster.Host{a, x}},
		{"partition in", func() { b.Partition(vcluster.In) }, b.Heal, a, b, [2]*vcluster.Host{a, x}},
		{"partition out", func() { b.Partition(vcluster.Out) }, b.Heal, a, b, [2]*vcluster.Host{a, x}},
		{"link down", b.LinkDown, b.LinkUp, a, b, [2]*vcluster.Host{a, x}},
	} {
		tc.cut()
		if got := dial(t, tc.from, tc.to); got != "" {
			t.Errorf("%s: %s still reaches %s", tc.name, tc.from.Name, tc.to.Name)
		}
		if !reaches(t, tc.stillWorks[0], tc.stillWorks[1]) {
			t.Errorf("%s of %s: %s no longer reaches %s", tc.name, b.Name, tc.stillWorks[0].Name, tc.stillWorks[1].Name)
		}
		tc.heal()
		if !reaches(t, tc.from, tc.to) {
			t.Errorf("%s: healed, but %s does not reach %s", tc.name, tc.from.Name, tc.to.Name)
		}
	}
	healed := b.Blip(time.Second)
	if got := dial(t, a, b); got != "" {
		t.Errorf("blip: %s still reaches %s", a.Name, b.Name)
	}
	<-healed
	if !reaches(t, a, b) {
		t.Errorf("after the blip %s does not reach %s", a.Name, b.Name)
	}
}

// TestStopCont: Stop freezes a host's process, Cont resumes it; Kill ends it.
func TestStopCont(t *testing.T) {
	t.Parallel()
	c := vcluster.New(t, 2, vcluster.Options{})
	a, b := c.Hosts[0], c.Hosts[1]
	b.StartEnv([]string{helperEnv + "=serve"}, self(t))
	if !reaches(t, a, b) {
		t.Fatalf("node1 does not reach node2\n%s", c.Dump())
	}
	b.Stop()
	if got := dial(t, a, b); got != "" {
		t.Errorf("a stopped server answered %q", got)
	}
	b.Cont()
	if !reaches(t, a, b) {
		t.Errorf("the continued server does not answer")
	}
	b.Kill()
	if code, err := b.Proc().Wait(5 * time.Second); err != nil || code != -1 {
		t.Errorf("after Kill: exit %d, %v; want -1 (signalled)", code, err)
	}
}

// TestCleanupLeavesNothing: after a cluster is torn down, no namespace with
// its prefix is left and no process that ran in its namespaces (the ones it
// started, and their children) is alive, also for a stopped process, an
// active partition and a link that is down.
func TestCleanupLeavesNothing(t *testing.T) {
	t.Parallel()
	var (
		prefix string
		pids   []int
		inodes []uint64
	)
	t.Run("cluster", func(t *testing.T) {
		c := vcluster.New(t, 3, vcluster.Options{})
		prefix = c.Prefix()
		for _, h := range c.Hosts {
			h.StartEnv([]string{helperEnv + "=sleep"}, self(t))
			// A child in a group of its own, as a worker would be.
			h.Start("sh", "-c", "setsid sleep 3600 & exec sleep 3600")
		}
		for _, ns := range c.Namespaces() {
			fi, err := os.Stat(filepath.Join("/run/netns", ns))
			if err != nil {
				t.Fatal(err)
			}
			inodes = append(inodes, inode(fi))
		}
		testkit.WaitFor(t, 10*time.Second, "9 processes in the hosts' namespaces", func() bool {
			pids = inNamespaces(inodes)
			return len(pids) >= 9 // 3 helpers, 3 sh→sleep, 3 setsid sleeps
		})
		c.Hosts[0].Stop()
		c.Hosts[1].Partition(vcluster.Both)
		c.Hosts[2].LinkDown()
		_ = c.Hosts[2].Blip(time.Hour) // cut short by the cleanup
		for _, p := range c.Procs() {
			if !slices.Contains(pids, p.Pid()) {
				t.Errorf("started pid %d is not among the namespaces' %v", p.Pid(), pids)
			}
		}
	})
	if prefix == "" {
		t.Skip("no cluster was made (the subtest says why)")
	}
	entries, err := os.ReadDir("/run/netns")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			t.Errorf("namespace %s is left", e.Name())
		}
	}
	for _, pid := range pids {
		if vcluster.Alive(pid) {
			t.Errorf("pid %d is left", pid)
		}
	}
	if left := inNamespaces(inodes); len(left) > 0 {
		t.Errorf("processes %v are left in the cluster's namespaces", left)
	}
}

// inNamespaces are the live processes whose network namespace is one of
// inodes.
func inNamespaces(inodes []uint64) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, p := range procs {
		fi, err := os.Stat(filepath.Join(p, "ns", "net"))
		if err != nil || !slices.Contains(inodes, inode(fi)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(p), "%d", &pid); err == nil && vcluster.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
