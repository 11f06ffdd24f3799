package supervise

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// testModeEnv makes the test binary, re-executed, the reaper process or an
// agent to be SIGKILLed (TestMain).
const testModeEnv = "SUPERVISE_TEST_MODE"

func TestMain(m *testing.M) {
	switch os.Getenv(testModeEnv) {
	case "reaper":
		if err := RunReaper(os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "agent":
		os.Exit(agentMain())
	}
	goleak.VerifyTestMain(m)
}

// patience bounds every wait in these tests: generous, for a loaded machine.
const patience = 20 * time.Second

// recorder is a LineSink that keeps every line.
type recorder struct {
	mu     sync.Mutex
	lines  map[Stream][]string
	closed *Exit
}

func (r *recorder) Line(s Stream, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lines == nil {
		r.lines = map[Stream][]string{}
	}
	r.lines[s] = append(r.lines[s], string(b))
}

func (r *recorder) Close(e Exit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = &e
}

var _ SinkCloser = (*recorder)(nil)

func (r *recorder) get(s Stream) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines[s])
}

// waitLines waits until stdout has n lines and returns them.
func (r *recorder) waitLines(t *testing.T, n int) []string {
	t.Helper()
	testkit.WaitFor(t, patience, fmt.Sprintf("%d lines of output", n), func() bool { return len(r.get(Stdout)) >= n })
	return r.get(Stdout)
}

// newSupervisor returns a Supervisor whose Run runs until the test ends.
func newSupervisor(t *testing.T, cfg Config) *Supervisor {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error)
	go func() { ran <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

// startShell starts sh -c script.
func startShell(t *testing.T, s *Supervisor, script string) (*Proc, *recorder) {
	t.Helper()
	rec := &recorder{}
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"-c", script}, Output: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Signal(syscall.SIGKILL)
		<-p.Done()
	})
	return p, rec
}

func waitDone(t *testing.T, p *Proc) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(patience):
		p.Signal(syscall.SIGKILL)
		t.Fatalf("pid %d not done within %s", p.Pid(), patience)
	}
}

// alive says whether pid names a process that is not a zombie.
func alive(pid int) bool {
	st := procStat(pid)
	return len(st) > 0 && st[0] != "Z" && st[0] != "X"
}

// present says whether pid is in /proc at all (zombies included).
func present(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("want a pid, got %q", s)
	}
	return n
}

func needSetsid(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid")
	}
}

func TestExit(t *testing.T) {
	s := newSupervisor(t, Config{})
	for _, tc := range []struct {
		script   string
		code     int
		signal   syscall.Signal
		exitCode int
		str      string
	}{
		{"exit 0", 0, 0, 0, "exit status 0"},
		{"exit 3", 3, 0, 3, "exit status 3"},
		{"kill -TERM $$", -1, syscall.SIGTERM, 143, "killed by SIGTERM"},
		{"kill -KILL $$", -1, syscall.SIGKILL, 137, "killed by SIGKILL"},
	} {
		p, rec := startShell(t, s, tc.script)
		waitDone(t, p)
		e := p.Exit()
		if e.Code != tc.code || e.Signal != tc.signal || e.ExitCode() != tc.exitCode || e.String() != tc.str || e.Err != nil {
			t.Errorf("%q: exit %+v (%s, %d), want code %d signal %v (%s, %d)", tc.script, e, e, e.ExitCode(), tc.code, tc.signal, tc.str, tc.exitCode)
		}
		select {
		case <-p.Exited():
		default:
			t.Errorf("%q: Done closed before Exited", tc.script)
		}
		if rec.closed == nil || rec.closed.ExitCode() != tc.exitCode {
			t.Errorf("%q: sink closed with %v", tc.script, rec.closed)
		}
	}
}

func TestStartFails(t *testing.T) {
	s := newSupervisor(t, Config{})
	if _, err := s.Start(Spec{Path: "/nonexistent/program"}); err == nil || !strings.Contains(err.Error(), "/nonexistent/program") {
		t.Errorf("Start of a missing program: %v", err)
	}
	if _, err := s.Start(Spec{Path: "no-such-program-in-path"}); err == nil {
		t.Error("Start of a program not in $PATH succeeded")
	}
}

func TestSpecEnvAndDir(t *testing.T) {
	s := newSupervisor(t, Config{})
	dir := t.TempDir()
	rec := &recorder{}
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"-c", `echo "$FOO"; pwd; echo "$` + TagEnv + `"`}, Env: []string{"FOO=bar", TagEnv + "=stale"}, Dir: dir, Output: rec})
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, p)
	got := rec.get(Stdout)
	if len(got) != 3 || got[0] != "bar" || got[1] != dir || !strings.HasPrefix(got[2], s.tagPrefix) {
		t.Errorf("output %q, want bar, %s and a tag of %s", got, dir, s.tagPrefix)
	}
}

func TestOutputLines(t *testing.T) {
	s := newSupervisor(t, Config{})
	p, rec := startShell(t, s, `printf 'one\n\ntwo\n'; printf 'on stderr\n' >&2; printf 'no newline'`)
	waitDone(t, p)
	if got, want := rec.get(Stdout), []string{"one", "", "two", "no newline"}; !slices.Equal(got, want) {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if got, want := rec.get(Stderr), []string{"on stderr"}; !slices.Equal(got, want) {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

// lateSink is a recorder that takes its first line only once the process
// is reaped, and a moment after: the rest waits in the pipe meanwhile, as
// on a loaded machine.
type lateSink struct {
	recorder
	pid   chan int
	first sync.Once
}

func (s *lateSink) Line(st Stream, b []byte) {
	s.first.Do(func() {
		pid := <-s.pid
		for deadline := time.Now().Add(patience); present(pid) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // past DrainOrphanWait and DrainGrace
	})
	s.recorder.Line(st, b)
}

// A process that fills its pipe and exits keeps every line, however long
// the lines take to read after its exit: no process holds the pipe any
// more, so it is read to its end, not closed after DrainOrphanWait (under
// load, launcher's TestFullDiskWarnsOnce lost a worker's last lines so).
func TestLinesLeftInPipeAfterExit(t *testing.T) {
	s := newSupervisor(t, Config{DrainOrphanWait: time.Millisecond, DrainGrace: time.Millisecond})
	rec := &lateSink{pid: make(chan int, 1)}
	const n = 3000 // about 30 KiB: the pipe holds them all
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "line $i"; i=$((i+1)); done`, n)}, Output: rec})
	if err != nil {
		t.Fatal(err)
	}
	rec.pid <- p.Pid()
	waitDone(t, p)
	got := rec.get(Stdout)
	if len(got) != n || got[n-1] != fmt.Sprintf("line %d", n-1) {
		t.Fatalf("%d lines, the last %q; want %d, the last \"line %d\"", len(got), got[len(got)-1:], n, n-1)
	}
}

// A line longer than MaxLine comes in pieces of MaxLine bytes, none lost.
func TestLongLine(t *testing.T) {
	s := newSupervisor(t, Config{})
	const n = 1500000
	p, rec := startShell(t, s, fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; echo; echo after`, n))
	waitDone(t, p)
	got := rec.get(Stdout)
	var lens []int
	for _, l := range got {
		lens = append(lens, len(l))
	}
	if want := []int{MaxLine, n - MaxLine, len("after")}; !slices.Equal(lens, want) {
		t.Errorf("line lengths %v, want %v", lens, want)
	}
}

func TestStop(t *testing.T) {
	s := newSupervisor(t, Config{})
	for _, tc := range []struct {
		name   string
		script string
		want   syscall.Signal
	}{
		{"SIGTERM ends it", "echo ready; sleep 300", syscall.SIGTERM},
		{"SIGTERM ignored: SIGKILL after the grace", "trap '' TERM; echo ready; while :; do sleep 1; done", syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rec := startShell(t, s, tc.script)
			rec.waitLines(t, 1)
			e := p.Stop(syscall.SIGTERM, 200*time.Millisecond)
			if e.Signal != tc.want {
				t.Errorf("exit %s, want killed by %s", e, unix.SignalName(tc.want))
			}
			waitDone(t, p)
		})
	}
}

// exitEarly records a zombie's exit before anyone reaps it, and nothing
// once wait4 has (the pid may name another process by then).
func TestExitEarly(t *testing.T) {
	cmd := exec.Command("sh", "-c", "exit 5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	p := &Proc{pid: cmd.Process.Pid, exited: make(chan struct{})}
	testkit.WaitFor(t, patience, "zombie", func() bool { st := procStat(p.pid); return len(st) > 0 && st[0] == "Z" })
	p.exitEarly()
	select {
	case <-p.Exited():
	default:
		t.Fatal("exitEarly did not record the zombie's exit")
	}
	if e := p.Exit(); !e.Early || e.Code != 5 {
		t.Errorf("exit %+v, want code 5, early", e)
	}
	reaped := &Proc{pid: cmd.Process.Pid, exited: make(chan struct{})}
	reaped.reaped.Store(true)
	reaped.exitEarly()
	select {
	case <-reaped.Exited():
		t.Error("exitEarly recorded an exit after wait4 reaped the process")
	default:
	}
}

func TestExitingStatus(t *testing.T) {
	fields := func(state string, flags uint64, exitCode int) []string {
		f := make([]string, 50)
		for i := range f {
			f[i] = "0"
		}
		f[0], f[6], f[49] = state, strconv.FormatUint(flags, 10), strconv.Itoa(exitCode)
		return f
	}
	for _, tc := range []struct {
		name   string
		f      []string
		ok     bool
		code   int
		signal syscall.Signal
	}{
		{"running", fields("S", 0x400040, 0), false, 0, 0},
		{"exiting with 3", fields("R", 0x400044, 3<<8), true, 3, 0},
		{"exiting, killed", fields("D", 0x404, int(unix.SIGKILL)), true, -1, unix.SIGKILL},
		{"zombie, exit 0", fields("Z", 0x400040, 0), true, 0, 0},
		{"short (old kernel)", []string{"R", "1"}, false, 0, 0},
		{"unreadable", nil, false, 0, 0},
	} {
		ws, ok := exitingStatus(tc.f)
		if ok != tc.ok {
			t.Errorf("%s: ok = %t, want %t", tc.name, ok, tc.ok)
			continue
		}
		if e := exitFromStatus(ws, nil); ok && (e.Code != tc.code || e.Signal != tc.signal) {
			t.Errorf("%s: exit %+v, want code %d signal %v", tc.name, e, tc.code, tc.signal)
		}
	}
	if allThreadsExiting(os.Getpid()) || allThreadsExiting(-1) {
		t.Error("a running or missing process reads as exiting")
	}
}

// Processes left in the group are killed once the process ended; ones that
// hold its output get DrainGrace first.
func TestGroupKilledAfterExit(t *testing.T) {
	s := newSupervisor(t, Config{DrainGrace: 100 * time.Millisecond})
	for _, script := range []string{
		"sleep 300 >/dev/null 2>&1 & echo $!",
		"sleep 300 & echo $!", // holds the pipes
	} {
		p, rec := startShell(t, s, script)
		waitDone(t, p)
		pid := atoi(t, rec.get(Stdout)[0])
		if present(pid) {
			t.Errorf("%q: the background child %d is still there after Done", script, pid)
		}
		if e := p.Exit(); e.Code != 0 {
			t.Errorf("%q: exit %s", script, e)
		}
	}
}

// Descendants that left the process group, by setsid or a double fork,
// are killed and reaped before Done.
func TestEscapedDescendantsGone(t *testing.T) {
	needSetsid(t)
	// A short grace: a setsid child that still was in the group when the
	// process exited holds the drain for two of them.
	s := newSupervisor(t, Config{DrainGrace: 200 * time.Millisecond})
	for _, tc := range []struct{ name, script string }{
		{"setsid", "setsid sleep 300 >/dev/null 2>&1 & echo $!"},
		{"setsid holding the pipes", "setsid sleep 300 & echo $!"},
		{"double fork", "(setsid sleep 300 >/dev/null 2>&1 & echo $!); exit 0"},
		{"double fork, no tag", "(env -i setsid sleep 300 >/dev/null 2>&1 & echo $!); exit 0"},
		{"setsid, then the worker runs on", "setsid sleep 300 >/dev/null 2>&1 & echo $!; sleep 0.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rec := startShell(t, s, tc.script)
			pid := atoi(t, rec.waitLines(t, 1)[0])
			waitDone(t, p)
			if present(pid) {
				t.Errorf("the escaped %d is still there after Done (state %v)", pid, procStat(pid))
			}
		})
	}
}

// While a process runs, Run finds its escaped descendants (for the reaper);
// when it is stopped they go too.
func TestScanFindsEscapees(t *testing.T) {
	needSetsid(t)
	s := newSupervisor(t, Config{ScanPeriod: 20 * time.Millisecond})
	p, rec := startShell(t, s, "setsid sleep 300 >/dev/null 2>&1 & echo $!; exec sleep 300")
	pid := atoi(t, rec.waitLines(t, 1)[0])
	testkit.WaitFor(t, patience, "escapee found", func() bool { return slices.Contains(s.Escaped(), pid) })
	if !alive(pid) {
		t.Fatalf("the escapee %d died while its process ran", pid)
	}
	p.Stop(syscall.SIGTERM, time.Second)
	waitDone(t, p)
	if present(pid) {
		t.Errorf("the escaped %d is still there after Done", pid)
	}
	testkit.WaitFor(t, patience, "escapee forgotten", func() bool { return len(s.Escaped()) == 0 })
}

// startReaperProcess runs RunReaper in a re-executed test binary.
func startReaperProcess(t *testing.T) *Reaper {
	t.Helper()
	t.Setenv(testModeEnv, "reaper")
	r, err := StartReaper([]string{os.Args[0]})
	os.Unsetenv(testModeEnv)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startVictim starts sh -c script in its own group (or session), returning
// the command and the first line it prints.
func startVictim(t *testing.T, script string, setsid bool) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: !setsid, Setsid: setsid}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return cmd, strings.TrimSpace(line)
}

func killedBySIGKILL(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	err := cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("pid %d ended with %v, want SIGKILL", cmd.Process.Pid, err)
	}
}

// goneOrZombie waits until pid has exited; a zombie child of this process
// is reaped.
func goneOrZombie(t *testing.T, pid int) {
	t.Helper()
	testkit.WaitFor(t, patience, fmt.Sprintf("end of %d", pid), func() bool { return !alive(pid) })
	if p, ok := readProc(pid); ok && p.ppid == os.Getpid() {
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, 0, nil)
	}
}

// At EOF the reaper kills listed groups and processes with their
// descendants, and spares what was deleted or has another start time.
func TestReaperKillsListed(t *testing.T) {
	r := startReaperProcess(t)
	group, _ := startVictim(t, "echo up; exec sleep 300", false)
	lone, child := startVictim(t, "sleep 300 & echo $!; wait", true)
	childPid := atoi(t, child)
	deleted, _ := startVictim(t, "echo up; exec sleep 300", false)
	reused, _ := startVictim(t, "echo up; exec sleep 300", true)
	lonePid, reusedPid := lone.Process.Pid, reused.Process.Pid
	loneInfo, _ := readProc(lonePid)
	reusedInfo, _ := readProc(reusedPid)

	r.addGroup(group.Process.Pid)
	r.addGroup(deleted.Process.Pid)
	r.delGroup(deleted.Process.Pid)
	r.addPid(lonePid, loneInfo.start)
	r.addPid(reusedPid, reusedInfo.start+1) // as if the pid named another process
	r.send("garbage")
	r.send("add 1")
	if err := r.Close(); err != nil {
		t.Fatalf("reaper: %v", err)
	}
	killedBySIGKILL(t, group)
	killedBySIGKILL(t, lone)
	goneOrZombie(t, childPid)
	if !alive(deleted.Process.Pid) || !alive(reusedPid) {
		t.Error("the reaper killed a deleted group or a pid with another start time")
	}
}

// agentMain is a supervising process for TestAgentKilled: it starts a
// process whose setsid child escapes, waits until a scan has told the
// reaper, prints "ready ESCAPEE WORKER REAPER" and sleeps until killed.
func agentMain() int {
	os.Setenv(testModeEnv, "reaper")
	r, err := StartReaper([]string{os.Args[0]})
	os.Unsetenv(testModeEnv)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	s, err := New(Config{Reaper: r, ScanPeriod: 20 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	go s.Run(context.Background())
	pids := make(chan int, 1)
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!; exec sleep 300"},
		Output: LineFunc(func(_ Stream, b []byte) {
			if n, err := strconv.Atoi(string(b)); err == nil {
				pids <- n
			}
		})})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	escapee := <-pids
	for !slices.Contains(s.Escaped(), escapee) {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("ready %d %d %d\n", escapee, p.Pid(), r.Pid())
	select {}
}

// When the supervising process is SIGKILLed, its processes' escaped
// descendants die too: the reaper was told about them.
func TestAgentKilled(t *testing.T) {
	needSetsid(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), testModeEnv+"=agent")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("agent: %q, %v", line, err)
	}
	var escapee, worker, reaper int
	if _, err := fmt.Sscanf(line, "ready %d %d %d", &escapee, &worker, &reaper); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for _, pid := range []int{worker, escapee, reaper} {
		goneOrZombie(t, pid)
	}
}
