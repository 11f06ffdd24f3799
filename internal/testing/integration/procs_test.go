package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// proc is one process seen in /proc.
type proc struct {
	pid, ppid int
	argv      []string
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
		argv := strings.Split(strings.TrimSuffix(string(cmd), "\x00"), "\x00")
		out = append(out, proc{pid: pid, ppid: ppid, argv: argv, argv0: argv[0]})
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

// tagged reports whether pid's environment holds the test id tag (see
// gotrainCmd): the process is one of the test's jobs or started by one.
func tagged(pid int, tag string) bool {
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for kv := range strings.SplitSeq(string(env), "\x00") {
		if kv == tag {
			return true
		}
	}
	return false
}

// leftovers returns the live processes of t's jobs: those whose
// environment carries t's tag (every process a job starts inherits it) and
// those below roots. Processes of tests running in parallel carry other
// tags and are not t's leftovers.
func leftovers(t testing.TB, roots ...int) []proc {
	tag := testTag(t)
	below := map[int]bool{}
	for _, root := range roots {
		for _, pid := range descendants(root, "") {
			below[pid] = true
		}
	}
	var out []proc
	for _, p := range processes() {
		if p.pid == os.Getpid() {
			continue
		}
		if below[p.pid] || tagged(p.pid, tag) {
			out = append(out, p)
		}
	}
	return out
}

// waitNoLeftovers fails the test unless no process of t's jobs (or below
// roots) is alive within d.
func waitNoLeftovers(t *testing.T, d time.Duration, roots ...int) {
	t.Helper()
	var left []proc
	defer func() {
		if len(left) > 0 { // waitUntil failed the test
			t.Logf("processes left %s after the job ended: %+v", d, left)
		}
	}()
	testkit.WaitFor(t, d, "no process of the job left", func() bool {
		left = leftovers(t, roots...)
		return len(left) == 0
	})
}
