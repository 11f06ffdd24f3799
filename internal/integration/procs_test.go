package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer that a running command writes while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one process seen in /proc.
type proc struct {
	pid, ppid int
	argv0     string
}

// processes lists the live processes (zombies excluded).
func processes() []proc {
	ents, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			continue
		}
		f := strings.Fields(s[i+2:])
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		argv0, _, _ := strings.Cut(string(cmd), "\x00")
		out = append(out, proc{pid: pid, ppid: ppid, argv0: argv0})
	}
	return out
}

// descendants returns the live processes below root whose argv[0] is prog
// ("" for any).
func descendants(root int, prog string) []int {
	ps := processes()
	parent := map[int]int{}
	for _, p := range ps {
		parent[p.pid] = p.ppid
	}
	var out []int
	for _, p := range ps {
		if prog != "" && p.argv0 != prog {
			continue
		}
		for a, n := parent[p.pid], 0; a > 1 && n < 64; a, n = parent[a], n+1 {
			if a == root {
				out = append(out, p.pid)
				break
			}
		}
	}
	return out
}

// leftovers returns live processes that run one of the test's binaries or
// descend from root.
func leftovers(root int) []proc {
	binDir := filepath.Dir(bin.gotrain)
	below := map[int]bool{}
	for _, pid := range descendants(root, "") {
		below[pid] = true
	}
	var out []proc
	for _, p := range processes() {
		if p.pid == os.Getpid() {
			continue
		}
		if below[p.pid] || strings.HasPrefix(p.argv0, binDir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// waitNoLeftovers fails the test unless no process of the test's binaries
// (or below root) is alive within d.
func waitNoLeftovers(t *testing.T, root int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := leftovers(root)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left %s after the job ended: %+v", d, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// poll waits until cond holds, failing the test after d.
func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
